"""Profile our server's frontend under load with py-spy (`pip install py-spy`).

    python -m bench.profile [--system ours|vllm] [--levels tokens,derender] [--length 2048] [--concurrency 8] [--out DIR]

Starts `decode-server serve` (or vLLM's own server) on the benchmark's engine configuration, and for
each level runs the load generator while `py-spy record --nonblocking` samples
the API-server process (not the engine processes). Writes per level a
the collapsed stacks (`raw-tmp/profile-<level>.txt`, git-ignored; an SVG
flamegraph next to them if inferno/flamegraph.pl is installed) and `profile-<level>.md`: the top functions by self time, and by inclusive
time for frames in decode_server/ and protocol/.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import systems
from bench.common import arun, ensure_model
from bench.loadgen import run_load
from bench.measure import CpuMeter
from bench.stats import summarize_load
from bench.workload import Workload


def _frame_key(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)"; drop the line number.
    if " (" in frame and frame.endswith(")"):
        fn, loc = frame[:-1].split(" (", 1)
        path = loc.rsplit(":", 1)[0]
        for marker in ("site-packages/", "lib/python3"):
            if marker in path:
                path = path.split(marker, 1)[1]
        return f"{fn} ({path})"
    return frame


# Where the frontend's time goes, by stack content (a sample may count in several rows).
CATEGORIES = [
    ("uvicorn `send` → transport.write (one socket write per SSE event)", r"RequestResponseCycle\.send "),
    ("sse-starlette + anyio per-stream/per-chunk machinery (incl. the send below it)", r"sse_starlette/"),
    ("vLLM OutputProcessor.process_outputs (incl. incremental detokenizer)", r"OutputProcessor\.process_outputs"),
    ("vLLM incremental detokenizer", r"v1/engine/detokenizer\.py"),
    ("vLLM stat loggers / iteration stats (Prometheus)", r"vllm/v1/metrics/"),
    ("vLLM parser parse_delta (reasoning + tool parser)", r"parse_delta"),
    ("pydantic model construction (vLLM DeltaMessage etc.)", r"pydantic/"),
    ("prometheus_client", r"prometheus_client/"),
    ("zmq (engine-core outputs)", r"zmq/"),
    ("decode_server response generator chain (metrics.track_stream → respond → pipeline)", r"decode_server/metrics\.py"),
    ("vLLM server handlers (vllm/entrypoints)", r"vllm/entrypoints/"),
]


def categorize(path: Path) -> tuple[list[tuple[str, float]], float]:
    import re

    counts = collections.Counter()
    loop_self = 0
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        for name, rx in CATEGORIES:
            if re.search(rx, stack):
                counts[name] += n
        if stack.split(";")[-1].startswith(("Runner.run (", "run (asyncio/runners")):
            loop_self += n
    rows = [(name, 100 * counts[name] / max(1, total)) for name, _ in CATEGORIES]
    return rows, 100 * loop_self / max(1, total)


def summarize_collapsed(path: Path, top: int = 25) -> tuple[list, list, int]:
    self_t: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [_frame_key(f) for f in stack.split(";")]
        if frames and frames[0].startswith("process ") or frames and frames[0].startswith("thread "):
            frames = [f for f in frames if not (f.startswith("process ") or f.startswith("thread "))]
        total += n
        if frames:
            self_t[frames[-1]] += n
        for f in set(frames):
            if "decode_server/" in f or "protocol/" in f:
                incl[f] += n
    return self_t.most_common(top), incl.most_common(top), total


def _markdown(a: argparse.Namespace, level: str, collapsed: Path, summary: dict, cpu: dict) -> list[str]:
    self_top, incl_top, total = summarize_collapsed(collapsed)
    cats, loop_self = categorize(collapsed)
    ms_tok = cpu["frontend_cpu_s"] * 1000 / max(1, summary["output_tokens"])
    return [
        f"# Frontend profile: {a.system}, level={level}, L={a.length}, c={a.concurrency}",
        "",
        f"- {summary['output_tokens']} tokens in {summary['wall_s']} s; frontend CPU {cpu['frontend_cpu_s']} s "
        f"= {ms_tok:.4f} ms/token; {total} py-spy samples at {a.rate} Hz (idle samples excluded by py-spy)",
        "",
        "## Where the time goes (share of samples whose stack contains ...)",
        "",
        "| % | |",
        "|---|---|",
        f"| {loop_self:.1f} | event loop itself (uvloop `run`: epoll, callbacks, native I/O; self time) |",
        *[f"| {pct:.1f} | {name} |" for name, pct in cats],
        "",
        "## Top functions by self time",
        "",
        "| % of samples | function |",
        "|---|---|",
        *[f"| {100 * n / max(1, total):.1f} | `{f}` |" for f, n in self_top],
        "",
        "## decode_server / protocol frames by inclusive time",
        "",
        "| % of samples | function |",
        "|---|---|",
        *[f"| {100 * n / max(1, total):.1f} | `{f}` |" for f, n in incl_top],
        "",
    ]


def profile_level(a: argparse.Namespace, server: systems.Server, wl: Workload, level: str, pyspy: str, out: Path) -> None:
    """Load one level while py-spy samples the API-server process; write profile-<system>-<level>.md."""
    tmp = out / "raw-tmp"
    collapsed = tmp / f"profile-{a.system}-{level}.txt"
    spy = subprocess.Popen(
        [pyspy, "record", "--pid", str(server.pid), "--nonblocking", "--rate", str(a.rate), "--format", "raw", "-o", str(collapsed)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    time.sleep(1.0)
    meter = CpuMeter(server.pid)
    s0 = meter.snapshot()
    load = arun(
        run_load(server.url, lambda w, i: wl.stream(level, a.length, i), concurrency=a.concurrency, requests=a.requests or a.concurrency, time_limit_s=300)
    )
    cpu = CpuMeter.delta(s0, meter.snapshot())
    spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
    spy.wait(60)
    summary = summarize_load(load)
    _render_svg(collapsed, tmp / f"profile-{a.system}-{level}.svg")
    lines = _markdown(a, level, collapsed, summary, cpu)
    (out / f"profile-{a.system}-{level}.md").write_text("\n".join(lines))
    print("\n".join(lines[:3]), flush=True)


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", choices=("ours", "vllm"), default="ours", help="whose API-server process to sample")
    p.add_argument("--levels", default="tokens,text,derender", help="workload levels (vllm: tokens,text,chat)")
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--bind", default="auto")
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(pyspy).exists():
        print("py-spy not found: pip install py-spy", file=sys.stderr)
        return 2
    out = a.out or systems.repo_root() / "bench" / "results" / f"{dt.date.today().isoformat()}-profile"
    tmp = out / "raw-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    model_dir = ensure_model()
    wl = Workload.build(AutoTokenizer.from_pretrained(model_dir), [256, a.length])
    factory = systems.ours if a.system == "ours" else systems.vllms_own
    server = factory(model_dir, tmp / "logs", a.bind, systems.engine_flags())
    server.start()
    try:
        arun(run_load(server.url, lambda w, i: wl.stream("tokens", 256, i), concurrency=2, requests=4, time_limit_s=120))
        for level in a.levels.split(","):
            profile_level(a, server, wl, level, pyspy, out)
    finally:
        server.stop()
    return 0


def _render_svg(collapsed: Path, svg: Path) -> None:
    """py-spy writes one format per recording; we keep the collapsed stacks (any flamegraph tool
    reads them) and render an SVG when `inferno-flamegraph` or `flamegraph.pl` is installed."""
    for tool in ("inferno-flamegraph", "flamegraph.pl"):
        exe = shutil.which(tool)
        if exe:
            with open(svg, "wb") as f:
                subprocess.call([exe, str(collapsed)], stdout=f)
            return


if __name__ == "__main__":
    sys.exit(main())
