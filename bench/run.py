"""`python -m bench.run`: ours vs vLLM's own server vs the in-process floor, interleaved repetitions.

    python -m bench.run [--repeat 5] [--out bench/results/<date>-headline] [--bind auto]
                        [--systems ours,vllm,inproc] [--only REGEX] [--list]

Starts every system once on the same engine configuration (bench.fleet), runs the interleaved
schedule (bench.scenarios), measures each run (the API-server process's CPU, the engine's, everyone
else's, and the client's latencies), and writes OUT/results.json (meta + every run, rewritten
after each run) and OUT/results.md (bench.report). Server logs go to OUT/raw-tmp/, which git ignores.
Every run is kept (no retries): the spread over the repetitions is the noise measure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import scenarios, systems
from bench.fleet import Fleet, render_matches
from bench.loadgen import LoadResult, arun, run_load
from bench.measure import CpuMeter, scrape, server_counters, wait_quiet
from bench.scenarios import Scenario
from bench.stats import summarize_load
from bench.workload import Workload

DEFAULT_BIND = "auto"  # measured fastest for one instance on a 2-core machine: see bench/README.md
QUIET_WAIT_S = 5.0  # per run: wait at most this long for other processes to go quiet
QUIET_BUDGET_S = 300.0  # ... and at most this long over the whole run
TIME_LIMIT_S = 300.0  # per run


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Recorder:
    """Measures one run at a time against a started system and keeps every record."""

    def __init__(self, out: Path, bind: str, quiet_wait_s: float, time_limit_s: float, meta: dict[str, Any]):
        self.out, self.bind, self.meta = out, bind, meta
        self.quiet_wait_s, self.time_limit_s = quiet_wait_s, time_limit_s
        self.quiet_spent_s = 0.0
        self.records: list[dict[str, Any]] = []

    def quiet(self, meter: CpuMeter) -> dict[str, Any]:
        """Wait (bounded per run and in all) for other processes to leave the cores alone."""
        budget = min(self.quiet_wait_s, max(0.0, QUIET_BUDGET_S - self.quiet_spent_s))
        if budget <= 0:
            return {"waited_s": 0.0, "foreign_cores_at_start": None, "budget_exhausted": self.quiet_wait_s > 0}
        q = wait_quiet(meter, budget)
        self.quiet_spent_s += q["waited_s"]
        return q

    def run_http(self, server: systems.Server, wl: Workload, sc: Scenario) -> None:
        meter = CpuMeter(server.pid)
        quiet = self.quiet(meter)
        scraped_a, snap_a = scrape(server.url), meter.snapshot()
        load = arun(run_load(server.url, wl.requests_of(sc), concurrency=sc.concurrency, requests=sc.requests, time_limit_s=self.time_limit_s))
        snap_b, scraped_b = meter.snapshot(), scrape(server.url)
        gen_a, gen_b = scraped_a.get("generation_tokens"), scraped_b.get("generation_tokens")
        engine_tokens = None if gen_a is None or gen_b is None else gen_b - gen_a
        summary = summarize_load(load)
        counters = server_counters(scraped_a, scraped_b, summary["output_tokens"])
        self.record(sc, summary, CpuMeter.delta(snap_a, snap_b), engine_tokens, quiet, load, counters)

    def run_floor(self, worker: systems.InprocWorker, sc: Scenario) -> None:
        quiet = self.quiet(CpuMeter(worker.pid))
        item = worker.run({**asdict(sc), "name": sc.id, "time_limit_s": self.time_limit_s}, self.time_limit_s + 180)
        self.record(sc, item["summary"], item["cpu"], item["engine_tokens"], quiet)

    def record(
        self, sc: Scenario, summary: dict, cpu: dict, engine_tokens, quiet, load: LoadResult | None = None,
        counters: dict | None = None,
    ) -> None:
        toks, wall = summary["output_tokens"], cpu["wall_s"]
        rec: dict[str, Any] = {
            "id": sc.id,
            **asdict(sc),
            "cell": sc.cell,
            "bind": self.bind,
            "at": dt.datetime.now().isoformat(timespec="seconds"),
            "summary": summary,
            "cpu": cpu,
            "frontend_cpu_ms_per_token": round(cpu["frontend_cpu_s"] * 1000 / toks, 4) if toks else None,
            "engine_cpu_ms_per_token": round(cpu["engine_cpu_s"] * 1000 / toks, 4) if toks else None,
            "frontend_cores": round(cpu["frontend_cpu_s"] / wall, 3) if wall else None,
            "engine_tokens": engine_tokens,
            "engine_tok_s": round(engine_tokens / wall, 1) if engine_tokens and wall else None,
            "quiet": quiet,
        }
        if counters is not None:  # ours: wake-ups per engine step, writes per token (issue #30)
            rec["server_counters"] = counters
        if load is not None:  # the floor checks its own lengths through its summary's errors
            done = [r for r in load.results if r.completed]
            rec["exact_length"] = bool(done) and all(r.tokens == sc.length for r in done)
        self.records.append(rec)
        self.save()
        s = summary
        log(
            f"{sc.id}: {s['completed']}/{s['requests']} ok, {s['output_tok_s']} tok/s, TTFT p50 {s['ttft_ms']['p50']} ms, "
            f"TPOT/request p50 {s['tpot_req_ms']['p50']} ms, frontend {rec['frontend_cpu_ms_per_token']} ms CPU/token, "
            f"foreign {cpu.get('foreign_cores')} cores" + (" TRUNCATED" if s.get("truncated") else "")
            + ("" if rec.get("exact_length", True) else " (lengths differ!)")
        )  # fmt: skip

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps({"meta": self.meta, "scenarios": self.records}, indent=1))


def machine_info() -> dict[str, Any]:
    import psutil

    try:
        import vllm

        vllm_version = vllm.__version__
    except ImportError:
        vllm_version = "unknown"
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=systems.repo_root(), capture_output=True, text=True)
    return {
        "cpus": os.cpu_count(),
        "cpu_model": models[0] if models else "",
        "mem_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "python": platform.python_version(),
        "vllm": vllm_version,
        "git_commit": commit.stdout.strip() or None,
    }


def run_all(rec: Recorder, blocks: dict[str, list[Scenario]], runs: list[Scenario], wl: Workload, model_dir: Path, tmp: Path) -> None:
    """Start every block's system, warm up, run the schedule, stop them; errors go to meta['errors']."""
    fleet = Fleet(tmp, model_dir, rec.bind, wl, list(blocks), log)
    try:
        fleet.start(rec.meta)
        if "vllm" in fleet.members:
            rec.meta["render_matches_vllm"] = render_matches(fleet.members["vllm"].url, wl)
        fleet.warm(wl, blocks)
        for i, sc in enumerate(runs):
            member = fleet.members[sc.system]
            if not fleet.alive(sc.system):
                raise RuntimeError(f"{sc.system} is no longer running:\n{member.log_tail()}")
            log(f"run {i + 1}/{len(runs)}: {sc.id}")
            try:
                if isinstance(member, systems.InprocWorker):
                    rec.run_floor(member, sc)
                else:
                    rec.run_http(member, wl, sc)
            except Exception as e:  # one failed run must not lose the others
                log(f"{sc.id} failed: {e}")
                rec.meta["errors"].append(f"{sc.id}: {str(e)[:2000]}")
    finally:
        fleet.stop()


def list_runs(blocks: dict[str, list[Scenario]], repeat: int, quiet_wait_s: float) -> None:
    runs = scenarios.schedule(blocks, repeat)
    for block, scs in blocks.items():
        for sc in scs:
            print(f"{block:7s} {sc.id:36s} {sc.requests:3d} requests x{repeat}, {sc.length * sc.requests * repeat:7d} output tokens")
    print(f"{len(runs)} runs, {sum(sc.length * sc.requests for sc in runs)} output tokens")
    per_cell: dict[str, float] = {}
    for sc in runs:
        per_cell[sc.cell] = per_cell.get(sc.cell, 0.0) + scenarios.run_estimate_s(sc)
    for cell, s in per_cell.items():
        print(f"  {cell:28s} ~{s / 60:5.1f} min of runs ({repeat} repetitions)")
    est = scenarios.estimate_s(runs, len(blocks), quiet_wait_s, QUIET_BUDGET_S)
    print(f"estimated wall time ~{est / 60:.1f} min on a busy machine (start-ups, warm-ups and quiet waits included)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=scenarios.REPEAT, help="repetitions per scenario (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="results directory (default bench/results/<date>-headline)")
    p.add_argument("--bind", default=DEFAULT_BIND, help="VLLM_CPU_OMP_THREADS_BIND for every engine (default: %(default)s)")
    p.add_argument("--systems", default=None, help="comma list of systems to start: ours,vllm,inproc (default: all)")
    p.add_argument("--only", default=None, help="regex: run only the scenarios whose id matches (e.g. 'L256-c64|-p[0-9]+')")
    p.add_argument("--quiet-wait", type=float, default=QUIET_WAIT_S, help="max seconds to wait for other processes to go quiet before each run")
    p.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, help="per-run time bound (s)")
    p.add_argument("--list", action="store_true", help="print the scenarios, their output tokens and the estimated time, and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if a.repeat < 1:
        p.error("--repeat N needs N >= 1")
    blocks = scenarios.filtered(scenarios.headline(), a.systems, a.only)
    if a.list:
        list_runs(blocks, a.repeat, a.quiet_wait)
        return 0
    out = a.out or systems.repo_root() / "bench" / "results" / f"{dt.date.today().isoformat()}-headline"
    tmp = out / "raw-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    model_dir = systems.ensure_model()
    from transformers import AutoTokenizer

    wl = Workload.build(AutoTokenizer.from_pretrained(model_dir), scenarios.lengths(), scenarios.LENGTH)
    runs = scenarios.schedule(blocks, a.repeat)
    meta: dict[str, Any] = {
        "mode": "headline",
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "bind": a.bind,
        "engine_flags": systems.engine_flags(),
        "tool_flags": systems.TOOL_FLAGS,
        "prompt_tokens": len(wl.prompt_ids),
        "time_limit_s": a.time_limit,
        "quiet_wait_s": a.quiet_wait,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "startup_s": {},
        "errors": [],
        "repeat": a.repeat,
        "schedule": [sc.id for sc in runs],
        "estimated_s": round(scenarios.estimate_s(runs, len(blocks), a.quiet_wait, QUIET_BUDGET_S)),
    }
    log(f"out={out} bind={a.bind} systems={list(blocks)}: {len(runs)} runs, estimated {meta['estimated_s'] / 60:.1f} min")
    rec = Recorder(out, a.bind, a.quiet_wait, a.time_limit, meta)
    try:
        run_all(rec, blocks, runs, wl, model_dir, tmp)
    except Exception as e:
        log(f"run failed: {e}")
        meta["errors"].append(str(e)[:2000])
    meta["duration_s"] = round(time.monotonic() - t_start, 1)
    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    rec.save()
    from bench.report import write_report

    write_report(out)
    log(f"wrote {out / 'results.json'} ({len(rec.records)} runs, {meta['duration_s']} s) and {out / 'results.md'}")
    return 1 if meta["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
