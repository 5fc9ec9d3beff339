"""`python -m bench.profile`: where each frontend's CPU goes, ours beside vLLM's own server (issue #30).

    python -m bench.profile [--length 512] [--concurrency 32] [--requests 64] [--rate 200]
                            [--pairs tokens:tokens,text:text,derender:chat] [--batch] [--out DIR]

Starts ours and vLLM's own server on the benchmark's engine configuration (bench.fleet), and per
pair of levels runs the same load on each, ours first then vLLM's, while `py-spy record` (the
`bench` extra) samples the API-server process only (not the engine). Writes OUT/profile.md: per
run, the CPU per token (the same meter as bench.run), the samples' self time by where the code
lives (uvicorn's socket write, the event loop, sse-starlette, vLLM's engine client, ours, ...), the
share under each stage (vLLM's output handler, our one-pass consumer, vLLM's serving generator),
and the top functions by self time; the collapsed stacks stay in OUT/raw-tmp/ (git-ignored). A sampling profiler costs the
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

# Self time (the frame a sample was in) by where that code lives, first match wins: the socket
# write is uvicorn's `send`; the event loop's own work is the loop's frame with nothing above it.
SELF = (
    ("uvicorn: the socket write (`RequestResponseCycle.send`)", r"RequestResponseCycle\.send "),
    ("uvicorn: the rest (HTTP parsing, the ASGI cycle)", r"uvicorn/"),
    ("the event loop's own work (epoll, callbacks)", r"^(Runner\.run|run) \((asyncio/runners|uvloop/)|selectors\.py|asyncio/(events|base_events)\.py"),
    ("sse-starlette", r"sse_starlette/"),
    ("anyio", r"anyio/"),
    ("Starlette", r"starlette/"),
    ("asyncio's tasks, futures and locks", r"asyncio/"),
    ("vLLM's metrics (stat loggers)", r"vllm/v1/metrics/"),
    ("vLLM's engine client (output processor, detokenizer, collectors)", r"vllm/v1/engine/|vllm/(tokenizers|transformers_utils)/|tokenizers/"),
    ("vLLM's serving code (vllm/entrypoints)", r"vllm/entrypoints/"),
    ("vLLM's parsers", r"vllm/(reasoning|tool_parsers|parser)/"),
    ("vLLM, other", r"vllm/"),
    ("pydantic", r"pydantic"),
    ("prometheus_client", r"prometheus_client/"),
    ("zmq and msgpack", r"zmq/|msgspec|msgpack"),
    ("ours: generate (one-pass consumer, stages, framing)", r"decode_server/generate/|protocol/"),
    ("ours: http, runtime (routes, SSE response, request records, metrics)", r"decode_server/"),
)
# Inclusive: the share of samples under one of these frames, anywhere in the stack.
UNDER = (
    ("vLLM's output handler (process_outputs, stat loggers, collector puts)", r"output_handler \("),
    ("ours: the one-pass consumer's passes (stages, framing, buffers)", r"StepConsumer\._pass "),
    ("vLLM's serving generator (per event: pydantic model, JSON)", r"(stream_generator|_stream_generator) \("),
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


def summarize(raw: Path, top: int = 15) -> tuple[list[list[str]], list[list[str]], list[list[str]], int]:
    """(self time by part, inclusive shares, top functions by self time, samples) from py-spy's raw
    (collapsed) output."""
    selves: collections.Counter[str] = collections.Counter()
    under: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        leaf = stack.split(";")[-1]
        functions[_frame(leaf)] += n
        selves[next((name for name, rx in SELF if re.search(rx, leaf)), "other")] += n
        for name, rx in UNDER:
            if re.search(rx, stack):
                under[name] += n
    share = lambda n: f"{100 * n / max(1, total):.1f}"  # noqa: E731
    return (
        [[share(selves[name]), name] for name in [*(name for name, _ in SELF), "other"]],
        [[share(under[name]), name] for name, _ in UNDER],
        [[share(n), f"`{fn}`"] for fn, n in functions.most_common(top)],
        total,
    )


def py_spy() -> str | None:
    """py-spy from PATH, or installed beside this Python (a virtualenv that is not activated)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def profile_run(server: systems.Server, wl: Workload, sc: Scenario, raw: Path, rate: int) -> dict:
    """One load on `server` with py-spy sampling its API process; returns CPU per token and the samples."""
    spy = subprocess.Popen(
        [py_spy(), "record", "--pid", str(server.pid), "--rate", str(rate), "--format", "raw",
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
    p.add_argument("--batch", action="store_true", help="`stream: false` requests (generate levels only: tokens, text)")
    p.add_argument("--out", type=Path, default=systems.repo_root() / "bench" / "results" / f"{time.strftime('%Y-%m-%d')}-profile")
    a = p.parse_args(argv)
    if not py_spy():
        p.error("py-spy is not installed: `pip install -e .[bench]` (or DECODE_SERVER_EXTRAS=bench ./dev setup)")
    pairs = [tuple(pair.split(":")) for pair in a.pairs.split(",")]
    tmp = a.out / "raw-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    model_dir = systems.ensure_model()
    from transformers import AutoTokenizer

    wl = Workload.build(AutoTokenizer.from_pretrained(model_dir), [a.length], a.length)
    runs = [
        Scenario(system, level, a.length, a.concurrency, a.requests, a.batch)
        for pair in pairs
        for system, level in zip(("ours", "vllm"), pair)
    ]
    fleet = Fleet(tmp, model_dir, "auto", wl, ["ours", "vllm"], log)
    sections = [
        "# Frontend profiles: ours beside vLLM's own server",
        "",
        f"`python -m bench.profile {' '.join(argv if argv is not None else sys.argv[1:])}`: {a.concurrency} concurrent {'batch requests' if a.batch else 'streams'}, "
        f"{a.requests} requests of {a.length} tokens per run, py-spy at {a.rate} Hz on the API-server process only.",
        "Per run: the samples by where their own (self) time was spent, then the share under each stage's frame, then the top functions.",
    ]
    try:
        fleet.start({"startup_s": {}})
        fleet.warm(wl, {"ours": [r for r in runs if r.system == "ours"], "vllm": [r for r in runs if r.system == "vllm"]})
        for sc in runs:
            log(f"profiling {sc.id}")
            raw = tmp / f"{sc.id}.txt"
            raw.unlink(missing_ok=True)
            res = profile_run(fleet.members[sc.system], wl, sc, raw, a.rate)
            selves, under, top, samples = summarize(raw)
            sections += [
                "",
                f"## {sc.system}, level {sc.level}",
                "",
                f"{res['tokens']} tokens, frontend CPU {res['frontend_cpu_ms_per_token']} ms/token (with the profiler attached), {samples} samples.",
                "",
                *md_table(["% of samples (self time)", "where the code is"], selves),
                "",
                *md_table(["% of samples (under it)", "stage"], under),
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
