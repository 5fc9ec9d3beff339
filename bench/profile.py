"""`python -m bench.profile`: where each frontend's CPU goes, ours beside vLLM's own server (issue #30).

    python -m bench.profile [--length 512] [--concurrency 32] [--requests 64] [--rate 200]
                            [--pairs tokens:tokens,text:text,derender:chat] [--out DIR]

Starts ours and vLLM's own server on the benchmark's engine configuration (bench.fleet), and per
pair of levels runs the same load on each, ours first then vLLM's, while `py-spy record` (the
`bench` extra) samples the API-server process only (not the engine). Writes OUT/profile.md: per
run, the CPU per token (the same meter as bench.run) and the share of samples in each part of the
path (a sample counts in every part its stack passes through), then the top functions by self
time; the collapsed stacks stay in OUT/raw-tmp/ (git-ignored). A sampling profiler costs the
process it samples a little CPU: compare shares, and take ratios from bench.run.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import systems
from bench.fleet import Fleet
from bench.loadgen import arun, run_load
from bench.measure import CpuMeter
from bench.report import md_table
from bench.run import log
from bench.scenarios import Scenario
from bench.workload import Workload

# The parts of a frontend's path, by a frame each stack passes through (py-spy raw frames read
# "function (path:line)"). Both servers' own code, and the code they share (vLLM's engine client).
PARTS = (
    ("event loop's own work (uvloop: epoll, callbacks; self time)", r"run \((uvloop/|asyncio/runners)[^;]*$"),
    ("uvicorn: HTTP parsing and the socket write", r"uvicorn/"),
    ("sse-starlette + anyio (the SSE response: task group, send)", r"sse_starlette/|anyio/"),
    ("starlette routing and request handling", r"[/(]starlette/"),
    ("vLLM OutputProcessor.process_outputs (detokenizer, stop strings, collectors)", r"process_outputs \([^;]*v1/engine/output_processor\.py"),
    ("vLLM incremental detokenizer", r"v1/engine/detokenizer\.py"),
    ("vLLM stat loggers (Prometheus)", r"vllm/v1/metrics/"),
    ("vLLM engine client: ZMQ receive and msgpack decode", r"zmq/|msgspec/_core|v1/serial_utils"),
    ("vLLM serving code (vllm/entrypoints: handlers, pydantic models, JSON)", r"vllm/entrypoints/"),
    ("vLLM parsers (reasoning + tool)", r"vllm/(reasoning|tool_parsers|parser)/"),
    ("pydantic", r"pydantic/|pydantic_core"),
    ("ours: one-pass consumer and stages (decode_server/generate)", r"decode_server/generate/"),
    ("ours: HTTP layer (decode_server/http)", r"decode_server/http/"),
    ("prometheus_client", r"prometheus_client/"),
)


def _frame(frame: str) -> str:
    """'function (path:line)' → 'function (short path)'."""
    if " (" not in frame or not frame.endswith(")"):
        return frame
    fn, loc = frame[:-1].split(" (", 1)
    path = loc.rsplit(":", 1)[0]
    for marker in ("site-packages/", "lib/python3"):
        path = path.split(marker, 1)[-1]
    return f"{fn} ({path})"


def summarize(raw: Path, top: int = 15) -> tuple[list[list[str]], list[list[str]], int]:
    """(parts table rows, top self-time rows, samples) from py-spy's raw (collapsed) output."""
    parts: collections.Counter[str] = collections.Counter()
    selfs: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        for name, rx in PARTS:
            if re.search(rx, stack):
                parts[name] += n
        selfs[_frame(stack.split(";")[-1])] += n
    share = lambda n: f"{100 * n / max(1, total):.1f}"  # noqa: E731
    return (
        [[share(parts[name]), name] for name, _ in PARTS],
        [[share(n), f"`{fn}`"] for fn, n in selfs.most_common(top)],
        total,
    )


def profile_run(server: systems.Server, wl: Workload, sc: Scenario, raw: Path, rate: int) -> dict:
    """One load on `server` with py-spy sampling its API process; returns CPU per token and the samples."""
    spy = subprocess.Popen(
        [shutil.which("py-spy") or "py-spy", "record", "--pid", str(server.pid), "--rate", str(rate), "--format", "raw",
         "--nonblocking", "--output", str(raw)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    time.sleep(1.0)  # py-spy attaches
    meter = CpuMeter(server.pid)
    a = meter.snapshot()
    load = arun(run_load(server.url, wl.requests_of(sc), concurrency=sc.concurrency, requests=sc.requests, time_limit_s=300))
    cpu = CpuMeter.delta(a, meter.snapshot())
    spy.send_signal(2)  # SIGINT: py-spy writes what it has
    _, err = spy.communicate(timeout=60)
    if not raw.exists():
        raise RuntimeError(f"py-spy wrote nothing for {sc.id}: {err.decode()[-2000:]}")
    tokens = sum(r.tokens for r in load.results if r.completed)
    errors = [r.error for r in load.results if r.error]
    if errors:
        raise RuntimeError(f"{sc.id}: {len(errors)} requests failed, first: {errors[0]}")
    return {"tokens": tokens, "frontend_cpu_ms_per_token": round(cpu["frontend_cpu_s"] * 1000 / max(1, tokens), 4)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--pairs", default="tokens:tokens,text:text,derender:chat", help="ours' level:vLLM's level, comma-separated")
    p.add_argument("--out", type=Path, default=systems.repo_root() / "bench" / "results" / f"{time.strftime('%Y-%m-%d')}-profile")
    a = p.parse_args(argv)
    if not shutil.which("py-spy"):
        p.error("py-spy is not installed: `pip install -e .[bench]` (or DECODE_SERVER_EXTRAS=bench ./dev setup)")
    pairs = [tuple(pair.split(":")) for pair in a.pairs.split(",")]
    tmp = a.out / "raw-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    model_dir = systems.ensure_model()
    from transformers import AutoTokenizer

    wl = Workload.build(AutoTokenizer.from_pretrained(model_dir), [a.length], a.length)
    runs = [Scenario(system, level, a.length, a.concurrency, a.requests) for pair in pairs for system, level in zip(("ours", "vllm"), pair)]
    fleet = Fleet(tmp, model_dir, "auto", wl, ["ours", "vllm"], log)
    sections = [
        "# Frontend profiles: ours beside vLLM's own server",
        "",
        f"`python -m bench.profile {' '.join(argv if argv is not None else sys.argv[1:])}`: {a.concurrency} concurrent streams, "
        f"{a.requests} requests of {a.length} tokens per run, py-spy at {a.rate} Hz on the API-server process only.",
        "A sample counts in every part its stack passes through; shares are of all samples of that run.",
    ]
    try:
        fleet.start({"startup_s": {}})
        fleet.warm(wl, {"ours": [r for r in runs if r.system == "ours"], "vllm": [r for r in runs if r.system == "vllm"]})
        for sc in runs:
            log(f"profiling {sc.id}")
            raw = tmp / f"{sc.id}.txt"
            raw.unlink(missing_ok=True)
            res = profile_run(fleet.members[sc.system], wl, sc, raw, a.rate)
            parts, top, samples = summarize(raw)
            sections += [
                "",
                f"## {sc.system}, level {sc.level}",
                "",
                f"{res['tokens']} tokens, frontend CPU {res['frontend_cpu_ms_per_token']} ms/token (with the profiler attached), {samples} samples.",
                "",
                *md_table(["% of samples", "part of the path"], parts),
                "",
                *md_table(["% self", "function"], top),
            ]
    finally:
        fleet.stop()
    (a.out / "profile.md").write_text("\n".join(sections) + "\n")
    log(f"wrote {a.out / 'profile.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
