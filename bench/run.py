"""One command for the issue #5 benchmarks.

    python -m bench.run [--smoke | --quick | --full] [--out bench/results/<date>-<mode>] [--bind auto] [--list]
    python -m bench.run --bind-sweep [--out DIR]   # which VLLM_CPU_OMP_THREADS_BIND is fastest here

Starts each system under test as a loopback subprocess, one at a time, on the
same engine configuration (demo model, --load-format dummy, replay logits
processor, same --max-num-seqs / --max-model-len / --kv-cache-memory-bytes), runs
the mode's scenarios against it, stops it, and writes
`OUT/results.json`, `OUT/raw/<scenario>.json`, `OUT/results.md` and PNG plots
(see bench/README.md). Server logs and (with --keep-traces) per-chunk traces go to
`OUT/raw-tmp/`, which git ignores.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import systems
from bench.loadgen import LoadResult, raw_trace, run_load, summarize_load
from bench.measure import CpuMeter, generation_tokens_total, wait_quiet
from bench.workload import Workload, chat_request

# A scenario during which other processes kept more than this many cores busy is re-run once,
# if it is short; at most MAX_RETRIES per run. Quiet waits are capped per run too.
RETRY_FOREIGN_CORES = 0.5
RETRY_MAX_WALL_S = 30.0
MAX_RETRIES = 8
QUIET_BUDGET_S = 120.0
DEFAULT_BIND = "auto"  # measured fastest for one instance on this 2-core machine: see bench/README.md
MODEL_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "decode-server" / "bench-demo-model"


@dataclass(frozen=True)
class Scenario:
    system: str  # ours | vllm | rfc | rfc-split | inproc | mixed
    level: str  # tokens | text | derender | text_lp20 | chat | rfc | alone | mixed
    length: int
    concurrency: int
    requests: int

    @property
    def id(self) -> str:
        return f"{self.system}-{self.level}-L{self.length}-c{self.concurrency}"


# --------------------------------------------------------------------- plans


def _cells(lengths, concs, requests_c1: dict[int, int], max_tokens_per_cell: int | None = None):
    for L in lengths:
        for c in concs:
            if max_tokens_per_cell and L * c > max_tokens_per_cell:
                continue
            yield L, c, (requests_c1.get(L, 1) if c == 1 else c)


def plan(mode: str) -> dict[str, Any]:
    """Scenarios per server block, and the mode's bounds."""
    if mode == "smoke":
        return {
            "lengths": [128],
            "blocks": {"ours": [Scenario("ours", "derender", 128, 2, 4)]},
            "time_limit_s": 30,
            "quiet_wait_s": 0,
            "retries": 0,
            "warm": False,
            # A functional check, not a measurement: skip torch.compile (~15-25 s of start-up).
            "flags": systems.engine_flags(max_num_seqs=8, max_model_len=4096, kv_bytes=256 * 1024**2) + ["--enforce-eager"],
        }
    if mode == "quick":
        cells = [(256, 1, 2), (256, 8, 8), (2048, 1, 1), (2048, 8, 8)]
        vllm = [Scenario("vllm", lv, L, c, n) for lv in ("tokens", "text", "chat") for L, c, n in cells]
        vllm.append(Scenario("vllm", "tokens", 256, 64, 64))
        rfc = [Scenario("rfc", "rfc", L, c, n) for L, c, n in [(256, 1, 2), (256, 8, 8), (2048, 1, 1)]]
        rfc += [Scenario("rfc-split", "rfc", L, c, n) for L, c, n in [(256, 1, 2), (2048, 1, 1)]]
        ours = [Scenario("ours", lv, L, c, n) for lv in ("tokens", "text", "derender", "text_lp20") for L, c, n in cells]
        ours += [Scenario("ours", "derender", 8192, 1, 1), Scenario("ours", "tokens", 256, 64, 64)]
        mixed = [Scenario("mixed", "alone", 2048, 8, 8), Scenario("mixed", "mixed", 2048, 8, 8)]
        inproc = [Scenario("inproc", "tokens", L, c, n) for L, c, n in cells] + [Scenario("inproc", "tokens", 256, 64, 64)]
        return {
            "lengths": [256, 2048, 8192],
            "blocks": {"vllm": vllm + rfc, "ours": ours + mixed, "inproc": inproc},
            "time_limit_s": 150,
            "quiet_wait_s": 10,
            "flags": systems.engine_flags(),
        }
    if mode == "full":
        lengths, concs = [256, 2048, 8192], [1, 8, 32, 64]
        cells = list(_cells(lengths, concs, {256: 3, 2048: 1, 8192: 1}, max_tokens_per_cell=64 * 2048))
        vllm = [Scenario("vllm", lv, L, c, n) for lv in ("tokens", "text", "chat") for L, c, n in cells]
        # Per-chunk derender replays the whole output per chunk (O(n^2) parser work): only small sizes fit.
        rfc = [Scenario("rfc", "rfc", L, c, n) for L, c, n in [(256, 1, 3), (256, 8, 8), (256, 32, 32), (256, 64, 64), (2048, 1, 1)]]
        rfc += [Scenario("rfc-split", "rfc", L, c, n) for L, c, n in [(256, 1, 3), (256, 8, 8), (2048, 1, 1)]]
        ours = [Scenario("ours", lv, L, c, n) for lv in ("tokens", "text", "derender", "text_lp20") for L, c, n in cells]
        mixed = [Scenario("mixed", lv, 2048, c, c) for c in (8, 64) for lv in ("alone", "mixed")]
        inproc = [Scenario("inproc", "tokens", L, c, n) for L, c, n in cells]
        return {
            "lengths": lengths,
            "blocks": {"vllm": vllm + rfc, "ours": ours + mixed, "inproc": inproc},
            "time_limit_s": 400,
            "quiet_wait_s": 30,
            "quiet_budget_s": 600,
            "flags": systems.engine_flags(),
        }
    raise ValueError(mode)


# --------------------------------------------------------------------- running


def arun(coro):
    """Run the load generator on uvloop when available (less client CPU on a shared 2-core box)."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


class Runner:
    def __init__(self, out: Path, mode: str, bind: str, keep_traces: bool, quiet_wait_s: float, time_limit_s: float):
        self.out = out
        self.mode = mode
        self.bind = bind
        self.keep_traces = keep_traces
        self.quiet_wait_s = quiet_wait_s
        self.time_limit_s = time_limit_s
        self.records: list[dict[str, Any]] = []
        self.warm_up = True
        self.derender_server: systems.Server | None = None
        self.quiet_budget_s = QUIET_BUDGET_S
        self.quiet_spent_s = 0.0
        self.retries_left = MAX_RETRIES
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
        return lambda w, i: wl.stream(sc.level, sc.length, i)

    def warm(self, server: systems.Server, wl: Workload, scenarios: list[Scenario]) -> None:
        """Two short requests per distinct (system, level) before measuring (imports, JIT, caches)."""
        L = min(wl.scripts)
        for system, level in sorted({(sc.system, sc.level) for sc in scenarios}):
            sc = Scenario(system, level, L, 2, 2)
            load = arun(run_load(server.url, self.make_stream(wl, sc), concurrency=2, requests=2, time_limit_s=120))
            errs = [r.error for r in load.results if r.error]
            if errs:
                raise RuntimeError(f"warm-up of {server.name}/{system}/{level} failed: {errs[0]}\n{server.log_tail()}")

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


def ensure_model() -> Path:
    """The demo model, built once with `decode-server demo-model DIR`."""
    if not (MODEL_CACHE / "config.json").exists():
        MODEL_CACHE.parent.mkdir(parents=True, exist_ok=True)
        subprocess.check_call([sys.executable, "-m", "decode_server.cli", "demo-model", str(MODEL_CACHE)], cwd=systems.repo_root())
    return MODEL_CACHE


def machine_info() -> dict[str, Any]:
    import psutil

    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import vllm

        vllm_version = vllm.__version__
    except Exception:
        vllm_version = "unknown"
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=systems.repo_root(), text=True).strip()
    except Exception:
        commit = None
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "mem_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "python": platform.python_version(),
        "vllm": vllm_version,
        "git_commit": commit,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--smoke", action="store_const", const="smoke", dest="mode", help="ours only, one scenario, < 90 s")
    g.add_argument("--quick", action="store_const", const="quick", dest="mode", help="lengths 256/2048 (+one 8192), concurrency 1/8 (+64)")
    g.add_argument("--full", action="store_const", const="full", dest="mode", help="the bounded full matrix (default)")
    g.add_argument("--bind-sweep", action="store_const", const="bind-sweep", dest="mode", help="compare VLLM_CPU_OMP_THREADS_BIND values")
    p.add_argument("--out", type=Path, default=None, help="results directory (default bench/results/<date>-<mode>)")
    p.add_argument("--bind", default=DEFAULT_BIND, help="VLLM_CPU_OMP_THREADS_BIND for every engine (default: %(default)s)")
    p.add_argument("--systems", default=None, help="comma list of blocks to run: vllm,ours,inproc (default: all of the mode)")
    p.add_argument("--quiet-wait", type=float, default=None, help="max seconds to wait for other processes to go quiet before each scenario")
    p.add_argument("--time-limit", type=float, default=None, help="per-scenario time bound (s)")
    p.add_argument("--only", default=None, help="regex: run only the scenarios whose id matches (e.g. 'ours-derender-.*')")
    p.add_argument("--keep-traces", action="store_true", help="also write per-chunk traces to OUT/raw-tmp/traces")
    p.add_argument("--no-report", action="store_true", help="skip results.md and plots")
    p.add_argument("--list", action="store_true", help="print the mode's scenarios (and output tokens) and exit")
    a = p.parse_args(argv)
    mode = a.mode or "full"
    if mode == "bind-sweep":
        from bench.bindsweep import sweep

        return sweep(a.out)
    pl = plan(mode)
    if a.list:
        total = 0
        for block, scs in pl["blocks"].items():
            for sc in scs:
                n = sc.length * sc.requests
                total += n
                print(f"{block:7s} {sc.id:32s} {sc.requests:3d} requests, {n:7d} output tokens")
        print(f"{sum(len(v) for v in pl['blocks'].values())} scenarios, {total} output tokens")
        return 0
    out = a.out or systems.repo_root() / "bench" / "results" / f"{dt.date.today().isoformat()}-{mode}"
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(
        out, mode, a.bind, a.keep_traces,
        pl["quiet_wait_s"] if a.quiet_wait is None else a.quiet_wait,
        pl["time_limit_s"] if a.time_limit is None else a.time_limit,
    )  # fmt: skip
    runner.warm_up = pl.get("warm", True)
    runner.quiet_budget_s = pl.get("quiet_budget_s", QUIET_BUDGET_S)
    runner.retries_left = pl.get("retries", MAX_RETRIES)
    t_start = time.monotonic()
    load_start = os.getloadavg()
    model_dir = ensure_model()
    from transformers import AutoTokenizer

    wl = Workload.build(AutoTokenizer.from_pretrained(model_dir), pl["lengths"])
    flags = pl["flags"]
    blocks = pl["blocks"]
    if a.systems:
        wanted = set(a.systems.split(","))
        blocks = {k: v for k, v in blocks.items() if k in wanted}
    meta: dict[str, Any] = {
        "mode": mode,
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "bind": a.bind,
        "engine_flags": flags,
        "tool_flags": systems.TOOL_FLAGS,
        "prompt_tokens": len(wl.prompt_ids),
        "time_limit_s": runner.time_limit_s,
        "quiet_wait_s": runner.quiet_wait_s,
        "loadavg_start": [round(x, 2) for x in load_start],
        "startup_s": {},
        "errors": [],
    }
    if a.only:
        import re

        rx = re.compile(a.only)
        blocks = {k: [sc for sc in v if rx.search(sc.id)] for k, v in blocks.items()}
        blocks = {k: v for k, v in blocks.items() if v}
    runner.log(f"mode={mode} out={out} bind={a.bind} blocks={list(blocks)} load={meta['loadavg_start']}")
    for name, scenarios in blocks.items():
        try:
            if name == "inproc":
                runner.run_inproc_block(model_dir, flags, wl, scenarios, meta)
            else:
                factory = systems.ours if name == "ours" else systems.vllms_own
                runner.run_server_block(name, factory(model_dir, runner.tmp / "logs", a.bind, flags), wl, scenarios, meta, model_dir, flags)
        except Exception as e:  # one broken system must not lose the others' results
            runner.log(f"block {name} failed: {e}")
            meta["errors"].append(f"{name}: {str(e)[:2000]}")
    meta["duration_s"] = round(time.monotonic() - t_start, 1)
    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    (out / "results.json").write_text(json.dumps({"meta": meta, "scenarios": runner.records}, indent=1))
    runner.log(f"wrote {out / 'results.json'} ({len(runner.records)} scenarios, {meta['duration_s']} s)")
    if not a.no_report and mode != "smoke":
        from bench.report import write_report

        write_report(out)
        runner.log(f"wrote {out / 'results.md'} and plots")
    return 1 if meta["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
