"""The Runner: runs scenarios against a started system, measures them and writes each record.

Used by bench.run (one block at a time) and bench.interleave (all blocks up at once, interleaved).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench import systems
from bench.common import arun
from bench.loadgen import LoadResult, run_load
from bench.measure import CpuMeter, generation_tokens_total, wait_quiet
from bench.plans import RETRY_FOREIGN_CORES, RETRY_MAX_WALL_S, Plan, Scenario
from bench.stats import raw_trace, summarize_load
from bench.workload import WARM_REP, Workload, chat_request


class Runner:
    def __init__(self, out: Path, pl: Plan, bind: str, keep_traces: bool, quiet_wait_s: float, time_limit_s: float):
        self.out = out
        self.mode = pl.mode
        self.bind = bind
        self.keep_traces = keep_traces
        self.quiet_wait_s = quiet_wait_s
        self.time_limit_s = time_limit_s
        self.records: list[dict[str, Any]] = []
        self.warm_up = pl.warm
        self.derender_server: systems.Server | None = None
        self.quiet_budget_s = pl.quiet_budget_s
        self.quiet_spent_s = 0.0
        self.retries_left = pl.retries
        self.raw = out / "raw"
        self.tmp = out / "raw-tmp"
        self.raw.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def make_stream(self, wl: Workload, sc: Scenario):
        if sc.system == "rfc-split":
            url = self.derender_server.url
            return lambda w, i: wl.stream("rfc", sc.length, i, derender_url=url)
        if sc.level == "mixed":
            half = max(1, sc.concurrency // 2)
            return lambda w, i: wl.stream("tokens" if w < half else "derender", sc.length, i)
        if sc.level == "alone":
            return lambda w, i: wl.stream("tokens", sc.length, i)
        return lambda w, i: wl.stream(sc.level, sc.length, i, batch=sc.batch, prompt_len=sc.prompt_len, rep=sc.rep)

    def warm(self, server: systems.Server, wl: Workload, scenarios: list[Scenario]) -> None:
        """Two short requests per distinct (system, level) before measuring (imports, JIT, caches),
        and two per distinct long prompt length (unique prompts of their own: the first long prefill)."""
        L = wl.warm_length
        warm = [Scenario(system, level, L, 2, 2, batch) for system, level, batch in sorted({(sc.system, sc.level, sc.batch) for sc in scenarios})]
        warm += [
            Scenario(system, "tokens", L, 2, 2, rep=WARM_REP, prompt_len=p)
            for system, p in sorted({(sc.system, sc.prompt_len) for sc in scenarios if sc.prompt_len})
        ]
        for sc in warm:
            load = arun(run_load(server.url, self.make_stream(wl, sc), concurrency=2, requests=2, time_limit_s=120))
            errs = [r.error for r in load.results if r.error]
            if errs:
                raise RuntimeError(f"warm-up of {server.name}/{sc.id} failed: {errs[0]}\n{server.log_tail()}")

    def quiet(self, meter: CpuMeter) -> dict | None:
        """Wait (bounded per scenario and per run) for other processes to leave the cores alone."""
        budget = min(self.quiet_wait_s, max(0.0, self.quiet_budget_s - self.quiet_spent_s))
        if budget <= 0:
            return {"waited_s": 0.0, "foreign_cores_at_start": None, "budget_exhausted": self.quiet_wait_s > 0}
        q = wait_quiet(meter, budget)
        self.quiet_spent_s += q["waited_s"]
        return q

    def run_http(self, server: systems.Server, wl: Workload, sc: Scenario) -> dict[str, Any]:
        split = sc.system == "rfc-split"
        # rfc-split: the generate server's and the derender server's API processes are both "frontend".
        meter = CpuMeter([server.pid, self.derender_server.pid] if split else server.pid)
        best = None
        for attempt in range(2):
            quiet = self.quiet(meter)
            gen_a = generation_tokens_total(server.url)
            snap_a = meter.snapshot()
            load = arun(
                run_load(server.url, self.make_stream(wl, sc), concurrency=sc.concurrency, requests=sc.requests, time_limit_s=self.time_limit_s)
            )
            snap_b = meter.snapshot()
            gen_b = generation_tokens_total(server.url)
            engine_tokens = None if gen_a is None or gen_b is None else gen_b - gen_a
            cpu = CpuMeter.delta(snap_a, snap_b)
            if best is None or (cpu["foreign_cores"] or 0) < (best[1]["foreign_cores"] or 0):
                best = (load, cpu, engine_tokens, quiet)
            # A scenario that shared the cores with someone else's work is run once more (bounded).
            if (
                attempt == 1
                or (cpu["foreign_cores"] or 0) <= RETRY_FOREIGN_CORES
                or cpu["wall_s"] > RETRY_MAX_WALL_S
                or self.retries_left <= 0
            ):
                break
            self.retries_left -= 1
            self.log(f"{sc.id}: {cpu['foreign_cores']} foreign cores during the run; running it again")
        load, cpu, engine_tokens, quiet = best
        rec = self.record(sc, load, cpu, engine_tokens, quiet, server, attempts=attempt + 1)
        return rec

    def record(self, sc: Scenario, load: LoadResult, cpu: dict, engine_tokens, quiet, server=None, summary=None, attempts=1) -> dict:
        summary = summary or summarize_load(load)
        toks = summary["output_tokens"]
        rec: dict[str, Any] = {
            "id": sc.id,
            **asdict(sc),
            "cell": sc.cell,
            "mode": self.mode,
            "bind": self.bind,
            "at": dt.datetime.now().isoformat(timespec="seconds"),
            "summary": summary,
            "cpu": cpu,
            "frontend_cpu_ms_per_token": round(cpu["frontend_cpu_s"] * 1000 / toks, 4) if toks else None,
            "engine_cpu_ms_per_token": round(cpu["engine_cpu_s"] * 1000 / toks, 4) if toks else None,
            "frontend_cores": round(cpu["frontend_cpu_s"] / cpu["wall_s"], 3) if cpu["wall_s"] else None,
            "engine_tokens": engine_tokens,
            "engine_tok_s": round(engine_tokens / cpu["wall_s"], 1) if engine_tokens and cpu["wall_s"] else None,
            "quiet": quiet,
            "attempts": attempts,
        }
        if load is not None:
            done = [r for r in load.results if r.completed]
            rec["exact_length"] = bool(done) and all(r.tokens == sc.length for r in done)
            if self.keep_traces:
                (self.tmp / "traces").mkdir(exist_ok=True)
                (self.tmp / "traces" / f"{sc.id}.json").write_text(json.dumps(raw_trace(load)))
        (self.raw / f"{sc.id}.json").write_text(json.dumps(rec, indent=1))
        self.records.append(rec)
        s = rec["summary"]
        self.log(
            f"{sc.id}: {s['completed']}/{s['requests']} ok, {s['output_tok_s']} tok/s, TPOT/request p50 {s['tpot_req_ms']['p50']} ms, "
            f"TPOT/token p99 {s['tpot_ms']['p99']} ms, E2E p50 {s['e2e_ms']['p50']} ms, frontend {rec['frontend_cpu_ms_per_token']} ms CPU/token, "
            f"foreign {cpu.get('foreign_cores')} cores" + (" TRUNCATED" if s.get("truncated") else "")
            + ("" if rec.get("exact_length", True) else " (lengths differ!)")
        )
        return rec

    def run_server_block(
        self, name: str, server: systems.Server, wl: Workload, scenarios: list[Scenario], meta: dict, model_dir: Path, flags: list[str]
    ) -> None:
        self.log(f"starting {name} ({' '.join(server.argv[1:4])} ...)")
        server.start()
        meta["startup_s"][name] = server.startup_s
        self.log(f"{name} healthy after {server.startup_s} s (pid {server.pid})")
        try:
            if name == "vllm":
                meta["render_matches_vllm"] = check_render(server.url, wl)
            main = [sc for sc in scenarios if sc.system != "rfc-split"]
            split = [sc for sc in scenarios if sc.system == "rfc-split"]
            if self.warm_up:
                self.warm(server, wl, main)
            for sc in main:
                self.run_http(server, wl, sc)
            if split:
                # The RFC as deployed: derender on its own server (a second vLLM instance), so the
                # generate stream is not slowed (and coalesced) by derender work in the same process.
                self.derender_server = systems.vllms_own(model_dir, self.tmp / "logs", self.bind, flags, name="vllm-derender")
                self.log("starting vllm-derender (a second vLLM server, used only for /derender)")
                try:
                    self.derender_server.start()
                    meta["startup_s"]["vllm-derender"] = self.derender_server.startup_s
                    if self.warm_up:
                        self.warm(server, wl, split)
                    for sc in split:
                        self.run_http(server, wl, sc)
                finally:
                    self.derender_server.stop()
        finally:
            server.stop()

    def run_inproc_block(self, model_dir: Path, flags: list[str], wl: Workload, scenarios: list[Scenario], meta: dict) -> None:
        wl_path = self.tmp / "workload.json"
        wl_path.write_text(wl.to_json())
        sc_path = self.tmp / "inproc-scenarios.json"
        sc_path.write_text(json.dumps([
            {**asdict(sc), "name": sc.id, "time_limit_s": self.time_limit_s, "quiet_wait_s": min(5.0, self.quiet_wait_s)}
            for sc in scenarios
        ]))
        out_path = self.tmp / "inproc-out.json"
        argv = systems.inproc_argv(model_dir, flags, wl_path, sc_path, out_path)
        self.log("running inproc (AsyncLLM in-process, no HTTP)")
        t0 = time.monotonic()
        with open(self.tmp / "inproc.log", "wb") as logf:
            rc = subprocess.call(argv, stdout=logf, stderr=subprocess.STDOUT, env=systems.child_env(self.bind), cwd=systems.repo_root())
        meta["startup_s"]["inproc_total_run"] = round(time.monotonic() - t0, 1)
        if rc != 0 or not out_path.exists():
            raise RuntimeError(f"inproc failed ({rc}):\n{(self.tmp / 'inproc.log').read_text(errors='replace')[-3000:]}")
        by_id = {sc.id: sc for sc in scenarios}
        for item in json.loads(out_path.read_text()):
            sc = by_id[item["scenario"]["name"]]
            self.record(sc, None, item["cpu"], item["engine_tokens"], item["quiet"], summary=item["summary"])


def check_render(url: str, wl: Workload) -> bool | None:
    """Is our prompt (demo tokenizer's chat template) what vLLM's /v1/chat/completions/render makes?"""
    try:
        r = httpx.post(url + "/v1/chat/completions/render", json=chat_request(), timeout=60, trust_env=False)
        body = r.json()
        body = body[0] if isinstance(body, list) else body
        return body["token_ids"] == wl.prompt_ids
    except Exception:
        return None
