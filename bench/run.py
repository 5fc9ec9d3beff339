"""One command for the issue #5 benchmarks.

    python -m bench.run [--smoke | --quick | --full] [--out bench/results/<date>-<mode>] [--bind auto] [--list]
    python -m bench.run --headline [--repeat 5]    # interleaved repetitions: medians and spreads
    python -m bench.run --bind-sweep [--out DIR]   # which VLLM_CPU_OMP_THREADS_BIND is fastest here

Starts each system under test as a loopback subprocess, one at a time, on the
same engine configuration (demo model, --load-format dummy, replay logits
processor, same --max-num-seqs / --max-model-len / --kv-cache-memory-bytes), runs
the mode's scenarios against it, stops it, and writes
`OUT/results.json`, `OUT/raw/<scenario>.json`, `OUT/results.md` and PNG plots
(see bench/README.md). `--headline` instead keeps ours, vLLM's server and the
in-process floor up together and interleaves N repetitions of every scenario
(bench.interleave). Server logs and (with --keep-traces) per-chunk traces go to
`OUT/raw-tmp/`, which git ignores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import systems
from bench.common import DEFAULT_BIND, ensure_model, machine_info
from bench.plans import Plan, Scenario, plan
from bench.runner import Runner
from bench.workload import Workload


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--smoke", action="store_const", const="smoke", dest="mode", help="ours only, one scenario, < 90 s")
    g.add_argument("--quick", action="store_const", const="quick", dest="mode", help="lengths 256/2048 (+one 8192), concurrency 1/8 (+64)")
    g.add_argument("--full", action="store_const", const="full", dest="mode", help="the bounded full matrix (default)")
    g.add_argument(
        "--headline", action="store_const", const="headline", dest="mode",
        help="ours vs vLLM vs the in-process floor at 8/32/64 streams, 32 batch requests and two TTFT cells, interleaved --repeat times",
    )  # fmt: skip
    g.add_argument("--bind-sweep", action="store_const", const="bind-sweep", dest="mode", help="compare VLLM_CPU_OMP_THREADS_BIND values")
    p.add_argument("--repeat", type=int, default=None, help="--headline: repetitions per scenario (default 5)")
    p.add_argument("--out", type=Path, default=None, help="results directory (default bench/results/<date>-<mode>)")
    p.add_argument("--bind", default=DEFAULT_BIND, help="VLLM_CPU_OMP_THREADS_BIND for every engine (default: %(default)s)")
    p.add_argument("--systems", default=None, help="comma list of blocks to run: vllm,ours,inproc (default: all of the mode)")
    p.add_argument("--quiet-wait", type=float, default=None, help="max seconds to wait for other processes to go quiet before each scenario")
    p.add_argument("--time-limit", type=float, default=None, help="per-scenario time bound (s)")
    p.add_argument("--only", default=None, help="regex: run only the scenarios whose id matches (e.g. 'ours-derender-.*')")
    p.add_argument("--keep-traces", action="store_true", help="also write per-chunk traces to OUT/raw-tmp/traces")
    p.add_argument("--no-report", action="store_true", help="skip results.md and plots")
    p.add_argument("--list", action="store_true", help="print the mode's scenarios (and output tokens) and exit")
    return p


def list_plan(blocks: dict[str, list[Scenario]], repeat: int, pl: Plan | None = None) -> None:
    total = 0
    for block, scs in blocks.items():
        for sc in scs:
            n = sc.length * sc.requests * repeat
            total += n
            times = f" x{repeat}" if repeat > 1 else ""
            print(f"{block:7s} {sc.id:36s} {sc.requests:3d} requests{times}, {n:7d} output tokens")
    runs = sum(len(v) for v in blocks.values())
    print(f"{runs} scenarios" + (f", {runs * repeat} runs" if repeat > 1 else "") + f", {total} output tokens")
    if pl is not None and pl.interleaved:
        from bench.interleave import estimate_s, run_estimate_s, schedule

        runs_ = schedule(blocks, repeat)
        per_cell: dict[str, float] = {}
        for sc in runs_:
            per_cell[sc.cell] = per_cell.get(sc.cell, 0.0) + run_estimate_s(sc)
        for cell, s in per_cell.items():
            print(f"  {cell:28s} ~{s / 60:5.1f} min of runs ({repeat} repetitions)")
        est = estimate_s(runs_, len(blocks), pl.quiet_wait_s, pl.quiet_budget_s)
        print(
            f"estimated wall time ~{est / 60:.1f} min on a busy machine (start-ups, warm-ups and quiet waits of at most "
            f"{pl.quiet_wait_s:g} s per run and {pl.quiet_budget_s:g} s in all included)"
        )


def new_meta(mode: str, pl: Plan, runner: Runner, wl: Workload, bind: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "bind": bind,
        "engine_flags": pl.flags,
        "tool_flags": systems.TOOL_FLAGS,
        "prompt_tokens": len(wl.prompt_ids),
        "time_limit_s": runner.time_limit_s,
        "quiet_wait_s": runner.quiet_wait_s,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "startup_s": {},
        "errors": [],
    }


def run_blocks(runner: Runner, pl: Plan, blocks: dict[str, list[Scenario]], wl: Workload, model_dir: Path, meta: dict) -> None:
    """The sequential modes: each block's system started, measured and stopped in turn."""
    for name, scenarios in blocks.items():
        try:
            if name == "inproc":
                runner.run_inproc_block(model_dir, pl.flags, wl, scenarios, meta)
            else:
                factory = systems.ours if name == "ours" else systems.vllms_own
                server = factory(model_dir, runner.tmp / "logs", runner.bind, pl.flags)
                runner.run_server_block(name, server, wl, scenarios, meta, model_dir, pl.flags)
        except Exception as e:  # one broken system must not lose the others' results
            runner.log(f"block {name} failed: {e}")
            meta["errors"].append(f"{name}: {str(e)[:2000]}")


def execute(a: argparse.Namespace, mode: str, pl: Plan, blocks: dict[str, list[Scenario]]) -> int:
    out = a.out or systems.repo_root() / "bench" / "results" / f"{dt.date.today().isoformat()}-{mode}"
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(
        out, pl, a.bind, a.keep_traces,
        pl.quiet_wait_s if a.quiet_wait is None else a.quiet_wait,
        pl.time_limit_s if a.time_limit is None else a.time_limit,
    )  # fmt: skip
    t_start = time.monotonic()
    model_dir = ensure_model()
    from transformers import AutoTokenizer

    wl = Workload.build(AutoTokenizer.from_pretrained(model_dir), pl.lengths, pl.warm_length)
    meta = new_meta(mode, pl, runner, wl, a.bind)
    runner.log(f"mode={mode} out={out} bind={a.bind} blocks={list(blocks)} load={meta['loadavg_start']}")
    if pl.interleaved:
        from bench.interleave import run_interleaved

        try:
            run_interleaved(runner, pl, blocks, wl, model_dir, meta)
        except Exception as e:
            runner.log(f"interleaved run failed: {e}")
            meta["errors"].append(f"interleaved: {str(e)[:2000]}")
    else:
        run_blocks(runner, pl, blocks, wl, model_dir, meta)
    meta["duration_s"] = round(time.monotonic() - t_start, 1)
    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    (out / "results.json").write_text(json.dumps({"meta": meta, "scenarios": runner.records}, indent=1))
    runner.log(f"wrote {out / 'results.json'} ({len(runner.records)} scenarios, {meta['duration_s']} s)")
    if not a.no_report and mode != "smoke":
        from bench.report import write_report

        write_report(out)
        runner.log(f"wrote {out / 'results.md'} and plots")
    return 1 if meta["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    mode = a.mode or "full"
    if a.repeat is not None and (mode != "headline" or a.repeat < 1):
        p.error("--repeat N (N >= 1) goes with --headline")
    if mode == "bind-sweep":
        from bench.bindsweep import sweep

        return sweep(a.out)
    pl = plan(mode, a.repeat)
    blocks = pl.filtered(a.systems, a.only)
    if a.list:
        list_plan(blocks, pl.repeat, pl)
        return 0
    return execute(a, mode, pl, blocks)


if __name__ == "__main__":
    sys.exit(main())
