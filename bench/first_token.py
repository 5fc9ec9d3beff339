"""The first token's path in a burst: when vLLM's output handler has it, when the client reads it.

    python -m bench.first_token [--repeat 6] [--length 64] [--concurrency 64] [--levels tokens,text] [--out DIR]

Starts ours and vLLM's own server (bench.fleet) with `bench/first_token_hooks` on their PYTHONPATH:
its sitecustomize times, in each API process, every request's first put into its output collector
and every collection of the oldest generation. Then, interleaved
(A B, then B A), bursts of `--concurrency` streams sent at once, the same scripts as bench.run.
Per system and level, median [min–max] over the repetitions: TTFT p50 at the client; the delivery,
the median client read of the first token minus the median first put (what the API process adds
to the engine's first token); and the full collections in the API process during the bursts.
Writes OUT/results.json (every burst's times) and prints the table (OUT/results.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import systems
from bench.fleet import Fleet
from bench.loadgen import LoadResult, arun, run_load
from bench.scenarios import Scenario
from bench.stats import spread

HOOKS = Path(__file__).resolve().parent / "first_token_hooks"
API_ARGV = ("decode_server", "api_server")  # how an API process's argv names it (not its engine core's)


def burst_times(load: LoadResult) -> dict[str, list[float]]:
    """Each request's send and first-token read (absolute perf_counter seconds), sorted by send."""
    pairs = sorted((r.start, r.times[0]) for r in load.results if r.times)
    return {"sent": [a for a, _ in pairs], "first": [b for _, b in pairs]}


def read_traces(prefix: Path) -> list[dict[str, Any]]:
    traces = []
    for path in sorted(prefix.parent.glob(prefix.name + ".*.json")):
        trace = json.loads(path.read_text())
        if any(name in " ".join(trace["argv"]) for name in API_ARGV):
            traces.append(trace)
    return traces


def in_window(burst: dict[str, Any], traces: list[dict[str, Any]]) -> dict[str, Any]:
    """What the API processes noted between the burst's first send and its last first-token read."""
    start, end = burst["sent"][0], burst["first"][-1]
    puts = sorted(t for trace in traces for t in trace["first_put"].values() if start <= t <= end)
    full_gc = [s * 1e3 for trace in traces for at, s in trace["full_gc"] if start <= at <= end]
    return {"first_puts": puts, "full_gc_ms": full_gc}


def summary(burst: dict[str, Any]) -> dict[str, float | None]:
    ttft = sorted(b - a for a, b in zip(burst["sent"], burst["first"]))
    puts = burst["first_puts"]
    # Over half the burst's first puts seen: the delivery compares the same requests' medians.
    delivery = (statistics.median(burst["first"]) - statistics.median(puts)) * 1e3 if len(puts) * 2 > len(ttft) else None
    return {
        "ttft_p50_ms": statistics.median(ttft) * 1e3 if ttft else None,
        "delivery_ms": delivery,
        "full_gc_ms": sum(burst["full_gc_ms"]),
        "full_gcs": len(burst["full_gc_ms"]),
    }


def report(bursts: list[dict[str, Any]]) -> str:
    cells: dict[tuple[str, str], list[dict[str, float | None]]] = {}
    for b in bursts:
        cells.setdefault((b["system"], b["level"]), []).append(summary(b))
    lines = ["| system | level | TTFT p50, ms | delivery after the first put, ms | full collections (ms) in the bursts |",
             "|---|---|---|---|---|"]
    for (system, level), rows in sorted(cells.items()):
        cols = []
        for key in ("ttft_p50_ms", "delivery_ms"):
            s = spread([r[key] for r in rows], nd=1)
            cols.append(f"{s['median']} [{s['min']}–{s['max']}]")
        gcs = f"{sum(r['full_gcs'] for r in rows)} ({sum(r['full_gc_ms'] for r in rows):.0f})"
        lines.append(f"| {system} | {level} | {cols[0]} | {cols[1]} | {gcs} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=6)
    p.add_argument("--length", type=int, default=64, help="tokens per stream (at least 8)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--levels", default="tokens,text", help="generate levels; vLLM's server runs the same (derender: its chat)")
    p.add_argument("--out", type=Path, default=systems.repo_root() / "bench" / "results" / f"{dt.date.today().isoformat()}-first-token")
    a = p.parse_args(argv)
    out: Path = a.out
    (out / "raw-tmp").mkdir(parents=True, exist_ok=True)
    prefix = out / "raw-tmp" / "trace"
    # The servers' environment (bench.systems.child_env copies it): the hooks, switched on.
    os.environ["FIRST_TOKEN_TRACE"] = str(prefix)
    os.environ["PYTHONPATH"] = os.pathsep.join(part for part in (str(HOOKS), os.environ.get("PYTHONPATH", "")) if part)
    model_dir = systems.ensure_model()
    from transformers import AutoTokenizer

    from bench.workload import Workload

    wl = Workload.build(AutoTokenizer.from_pretrained(model_dir), [a.length], a.length)
    names, levels = ["ours", "vllm"], a.levels.split(",")
    fleet = Fleet(out / "raw-tmp", model_dir, "auto", wl, names, print)
    meta: dict[str, Any] = {"startup_s": {}, "argv": sys.argv[1:], "started": dt.datetime.now().isoformat(timespec="seconds")}
    bursts: list[dict[str, Any]] = []
    try:
        fleet.start(meta)
        level_of = {n: {lv: ("chat" if n == "vllm" and lv == "derender" else lv) for lv in levels} for n in names}
        fleet.warm(wl, {n: [Scenario(n, level_of[n][lv], a.length, 2, 2) for lv in levels] for n in names})
        time.sleep(2)  # the hooks are in (they look every second), before the first burst
        for rep in range(a.repeat):
            for lv in levels:
                for n in names if rep % 2 == 0 else names[::-1]:
                    sc = Scenario(n, level_of[n][lv], a.length, a.concurrency, a.concurrency, rep=rep)
                    time.sleep(1)
                    load = arun(run_load(fleet.members[n].url, wl.requests_of(sc), concurrency=a.concurrency,
                                         requests=a.concurrency, time_limit_s=120))
                    bursts.append({"system": n, "level": sc.level, "rep": rep, **burst_times(load)})
        time.sleep(2)  # the last burst's trace is written
    finally:
        fleet.stop()
    traces = read_traces(prefix)
    for b in bursts:
        b.update(in_window(b, traces))
    (out / "results.json").write_text(json.dumps({"meta": meta, "bursts": bursts}))
    table = report(bursts)
    (out / "results.md").write_text(f"# `python -m bench.first_token {' '.join(meta['argv'])}`\n\n{table}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
