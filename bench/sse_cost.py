"""What the SSE response path costs per event, without an engine: ours against a bare ASGI loop.

Each variant is a uvicorn process configured as `decode-server serve` runs uvicorn (uvloop,
httptools) serving K concurrent streams of N tokens-level frames (bare's encoded once, the others encoded per
event, as the server's pipeline does). A ticker releases
one frame per stream per tick, as the engine's output handler wakes every request once per step;
the server's CPU time (user + system, psutil) divided by the frames sent is the cost per event.

- `ours`: the production path: our app class with our middleware stack and `decode_server.http.sse`
  (sse-starlette's EventSourceResponse around our per-event loop, our framing and stalled-reader
  cut; the events sent below Starlette's per-send wrappers, as when no --middleware is given);
- `sse-starlette-loop`: the same routes and middleware in a plain Starlette app, the events sent by
  sse-starlette's own per-event loop (`EventSourceResponse` with its per-send timeout scope taken
  out, a generator framing each chunk, no stall watch) through Starlette's per-send wrappers:
  what ours did before 55f78ee gave it its own loop and sent its events below those wrappers;
- `sse-only`: our SSE response (`decode_server.http.sse`) called as the ASGI app itself, without
  Starlette's app and middleware stack around it: ours − sse-only is what the app and its
  middleware still cost, sse-only − bare what sse-starlette's response, our framing and stall watch cost;
- `bare`: a raw ASGI callable uvicorn calls directly: start, one `send` per frame, end.

The variants run interleaved (A, B, A, B …) and the report gives median and [min–max]:

    python -m bench.sse_cost --streams 32 --frames 2000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

from bench.loadgen import require_loopback

VARIANTS = ("ours", "sse-starlette-loop", "sse-only", "bare")
# A tokens-level stream chunk as our server writes it (one token, no logprobs).
CHUNK = {
    "id": "generate-tokens-bench",
    "object": "generate.chunk",
    "created": 1764590000,
    "model": "demo",
    "choices": [{"index": 0, "token_ids": [1234], "finish_reason": None}],
}


class Ticker:
    """One future per tick: every waiting stream wakes on the same tick, as on an engine step."""

    def __init__(self, period_s: float):
        self.period_s = period_s
        self.tick: asyncio.Future[None] | None = None

    async def next(self) -> None:
        if self.tick is None or self.tick.done():
            self.tick = asyncio.get_running_loop().create_future()
        await self.tick

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            if self.tick is not None and not self.tick.done():
                self.tick.set_result(None)


def _ticker(app_state: dict[str, Any], period_s: float) -> Ticker:
    if "ticker" not in app_state:
        ticker = Ticker(period_s)
        app_state["ticker"] = ticker
        app_state["task"] = asyncio.get_running_loop().create_task(ticker.run())
    return app_state["ticker"]


async def _chunks(state: dict[str, Any], frames: int, period_s: float) -> Any:
    """A stream's events after its first, one per tick, each encoded as the server's pipeline does."""
    from decode_server.http.sse import frame

    ticker = _ticker(state, period_s)
    for _ in range(frames - 1):
        await ticker.next()
        yield frame(CHUNK)


def bare_app(frames: int, period_s: float) -> Any:
    from decode_server.http.sse import DONE, frame

    state: dict[str, Any] = {}
    body = frame(CHUNK)
    headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-store")]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        ticker = _ticker(state, period_s)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for _ in range(frames):
            await ticker.next()
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": DONE, "more_body": False})

    return app


def sse_only_app(frames: int, period_s: float) -> Any:
    from decode_server.config import ServerConfig
    from decode_server.http.sse import frame, sse_response

    state: dict[str, Any] = {}
    stall_limit_s = ServerConfig(("demo",)).stream_send_timeout_s

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await _ticker(state, period_s).next()
        await sse_response(frame(CHUNK), _chunks(state, frames, period_s), stall_limit_s=stall_limit_s)(scope, receive, send)

    return app


def ours_app(frames: int, period_s: float, sse_starlette_loop: bool = False) -> Any:
    from starlette.applications import Starlette
    from starlette.routing import Route

    from decode_server.http.app import DecodeServerApp, _middleware
    from decode_server.config import ServerConfig
    from sse_starlette.sse import EventSourceResponse

    from decode_server.http.sse import DONE, frame, sse_response

    state: dict[str, Any] = {}
    config = ServerConfig(("demo",))

    class _PlainSends(EventSourceResponse):
        async def _send_with_timeout(self, send: Any, message: Any) -> None:
            await send(message)

    async def _with_done(rest: Any) -> Any:  # what our generator around sse-starlette's loop yielded
        yield frame(CHUNK)
        async for events in rest:
            yield events
        yield DONE

    async def endpoint(request: Any) -> Any:
        await _ticker(state, period_s).next()
        if sse_starlette_loop:
            return _PlainSends(_with_done(_chunks(state, frames, period_s)), sep="\n", ping=0)
        return sse_response(frame(CHUNK), _chunks(state, frames, period_s), stall_limit_s=config.stream_send_timeout_s)

    routes, middleware = [Route("/", endpoint, methods=["GET"])], _middleware(config, guarded=[])
    if sse_starlette_loop:
        return Starlette(routes=routes, middleware=middleware)
    return DecodeServerApp(events_below_middleware=True, routes=routes, middleware=middleware)


def serve(variant: str, port: int, frames: int, period_s: float) -> None:
    import uvicorn

    if variant == "bare":
        app = bare_app(frames, period_s)
    elif variant == "sse-only":
        app = sse_only_app(frames, period_s)
    else:
        app = ours_app(frames, period_s, sse_starlette_loop=variant == "sse-starlette-loop")
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning", access_log=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(variant: str, frames: int, period_s: float) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "bench.sse_cost", "--serve", variant, "--port", str(port)]
    cmd += ["--frames", str(frames), "--period", str(period_s)]
    proc = subprocess.Popen(cmd, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return proc, f"http://127.0.0.1:{port}/"


def _wait_listening(variant: str, proc: subprocess.Popen, url: str, timeout_s: float = 180) -> None:
    """Importing the app (vLLM comes with it) takes half a minute on a busy 2-core machine."""
    port = urlsplit(url).port
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{variant} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{variant} did not listen within {timeout_s} s")


async def _drive(url: str, streams: int) -> int:
    require_loopback(url)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=streams)) as client:

        async def one() -> int:
            events = 0
            async with client.stream("GET", url) as r:
                async for line in r.aiter_lines():
                    events += line.startswith("data: {")
            return events

        return sum(await asyncio.gather(*(one() for _ in range(streams))))


def measure(proc: subprocess.Popen, url: str, streams: int) -> dict[str, float]:
    server = psutil.Process(proc.pid)
    asyncio.run(_drive(url, 1))  # warm: imports, first connection
    t0 = server.cpu_times()
    started = time.perf_counter()
    events = asyncio.run(_drive(url, streams))
    wall = time.perf_counter() - started
    t1 = server.cpu_times()
    cpu = (t1.user - t0.user) + (t1.system - t0.system)
    return {"events": events, "cpu_s": cpu, "wall_s": wall, "us_per_event": cpu / events * 1e6}


def run(streams: int, frames: int, repeat: int, period_s: float, variants: tuple[str, ...] = VARIANTS) -> dict[str, list[dict[str, float]]]:
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    try:
        for v in variants:
            servers[v] = _start(v, frames, period_s)
        for v, (proc, url) in servers.items():
            _wait_listening(v, proc, url)
        for rep in range(repeat):
            order = variants if rep % 2 == 0 else variants[::-1]  # A B C, C B A, …
            for v in order:
                results[v].append(measure(*servers[v], streams))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    return results


def report(results: dict[str, list[dict[str, float]]], streams: int, frames: int) -> str:
    lines = [f"SSE path, {streams} streams x {frames} events, server CPU per event (µs), median [min–max]:", ""]
    lines += ["| variant | µs/event | runs |", "|---|---|---|"]
    med = {}
    for v, runs in results.items():
        xs = [r["us_per_event"] for r in runs]
        med[v] = statistics.median(xs)
        lines.append(f"| {v} | {med[v]:.1f} [{min(xs):.1f}–{max(xs):.1f}] | {len(xs)} |")
    lines.append("")
    for v in list(results)[1:]:
        ratios = [o["us_per_event"] / b["us_per_event"] for o, b in zip(results["ours"], results[v])]
        lines.append(f"- ours ÷ {v} per repetition: median {statistics.median(ratios):.2f} "
                     f"[{min(ratios):.2f}–{max(ratios):.2f}]; ours − {v}: {med['ours'] - med[v]:+.1f} µs/event")
    return "\n".join(lines)


def _provenance(load_before: float) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (f"`python -m bench.sse_cost {' '.join(sys.argv[1:])}`, measured {when} at commit {commit or '?'}"
            f"{' (+ uncommitted changes)' if dirty.strip() else ''}; "
            f"1-min load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--frames", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--period", type=float, default=0.002, help="seconds between ticks (one frame per stream)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="which to run, ours first (comma-separated)")
    p.add_argument("--out", help="write results.json and results.md here")
    p.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        serve(a.serve, a.port, a.frames, a.period)
        return
    load_before = os.getloadavg()[0]
    variants = tuple(a.variants.split(","))
    if variants[0] != "ours" or not set(variants) <= set(VARIANTS):
        p.error(f"--variants: ours first, then any of {', '.join(VARIANTS[1:])}")
    results = run(a.streams, a.frames, a.repeat, a.period, variants)
    text = f"{_provenance(load_before)}\n\n{report(results, a.streams, a.frames)}"
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump({"streams": a.streams, "frames": a.frames, "runs": results}, f, indent=1)
        with open(os.path.join(a.out, "results.md"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
