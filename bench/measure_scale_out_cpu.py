"""Frontend CPU per token with --api-server-count N (a measurement, not a test: no assertions).

    .venv/bin/python -m bench.measure_scale_out_cpu [--counts 1 2] [--streams 8] [--tokens 512]
        [--repeat 3] [--bind nobind|0] [--client-cores 0] [--server ours|vllm]

Starts `decode-server serve` on the demo model once per N (all up together), then, `--repeat` times
and in rotating order, sends `--streams` concurrent streams of `--tokens` tokens each (ignore_eos)
to each and reports the CPU seconds (user+system, psutil) the API processes used during the load:
with N=1 the server process itself (not its engine core child), with N>1 each API process (its
`APIServer_i` process title) and the parent; and the engine core's. Median [min–max] per N and level.
`--bind 0` puts the engine's OpenMP threads on core 0 (VLLM_CPU_OMP_THREADS_BIND), as a decode pod
leaves the frontend its own cores; the default lets them run on every core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from decode_server.tools.demo_model import build_demo_model
from tests.support import servers
from tests.support import GENERATE


_VLLM_SERVE = (
    "import sys; from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; from vllm.entrypoints.cli.serve import ServeSubcommand; "
    "a = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:]); validate_parsed_serve_args(a); ServeSubcommand.cmd(a)"
)


def _cpu(pids: list[int]) -> dict[int, float]:
    return {pid: sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids}


def _pids(parent: int, count: int) -> tuple[list[int], list[int]]:
    """The API processes (the server itself when N=1; vLLM's `APIServer_i` titles) and the engine cores."""
    children = psutil.Process(parent).children(recursive=True)
    cores = [p.pid for p in children if "EngineCore" in " ".join(p.cmdline())]
    api = [p.pid for p in children if "APIServer" in p.name()] if count > 1 else [parent]
    return sorted(api), cores


async def _load(url: str, streams: int, tokens: int, output_mode: str) -> int:
    body = {"token_ids": [9707, 11, 1879], "stream": True, "output_mode": output_mode,
            "sampling_params": {"max_tokens": tokens, "ignore_eos": True}}

    async def one() -> None:
        async with httpx.AsyncClient(timeout=600) as client:  # one connection per stream
            async with client.stream("POST", url + GENERATE, json=body) as r:
                assert r.status_code == 200, await r.aread()
                async for _ in r.aiter_lines():
                    pass

    await asyncio.gather(*(one() for _ in range(streams)))
    return streams * tokens


def start(which: str, count: int, streams: int, model: Path, logs: Path, bind: str) -> servers.Server:
    flags = ["--api-server-count", str(count), "--max-num-seqs", str(max(streams, 16))]
    env = {"VLLM_CPU_OMP_THREADS_BIND": bind}
    if which == "ours":
        return servers.ours(f"cpu-{which}-{count}", model, logs, *flags, env=env).start()
    # `vllm serve`'s own code (only its CLI runs several API processes; the console script is broken here)
    server = servers.vllms_own(f"cpu-{which}-{count}", model, logs, *flags)
    server.argv[1:3] = ["-c", _VLLM_SERVE]
    server.env.update(env)
    return server.start()


def measure(server: servers.Server, count: int, streams: int, tokens: int, mode: str) -> float:
    """One load: the API processes' CPU µs/token in all (each process's share is printed)."""
    api, cores = _pids(server.proc.pid, count)
    parent = [server.proc.pid] if count > 1 else []
    asyncio.run(_load(server.url, streams, 16, mode))  # warm up
    before, t0 = _cpu(api + cores + parent), time.monotonic()
    total = asyncio.run(_load(server.url, streams, tokens, mode))
    after, wall = _cpu(api + cores + parent), time.monotonic() - t0
    used = {pid: after[pid] - before[pid] for pid in after}
    api_s = sum(used[p] for p in api)
    core_s, parent_s = sum(used[p] for p in cores), sum(used[p] for p in parent)
    print(f"N={count} {mode}: {total} tokens in {wall:.1f}s; API processes {1e6 * api_s / total:.0f} us/token "
          f"(each: {', '.join(f'{used[p]:.2f}' for p in api)} CPU-s); engine core {1e6 * core_s / total:.0f} us/token; "
          f"parent {parent_s:.2f}s", flush=True)
    return 1e6 * api_s / total


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{statistics.median(ordered):.0f} [{ordered[0]:.0f}–{ordered[-1]:.0f}]"


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--counts", type=int, nargs="+", default=[1, 2])
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--modes", nargs="+", default=["tokens", "text"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--bind", default="nobind", help="VLLM_CPU_OMP_THREADS_BIND for the engine (default: %(default)s)")
    p.add_argument("--server", choices=["ours", "vllm"], default="ours", help="vllm: vLLM's own server, for comparison")
    p.add_argument("--client-cores", type=int, nargs="+", help="run the load generator on these cores (after the servers start)")
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="scale-out-cpu-"))
    model = build_demo_model(tmp / "model")
    up = {count: start(a.server, count, a.streams, model, tmp, a.bind) for count in a.counts}
    if a.client_cores:  # clients of a decode pod are elsewhere: keep this one off the frontend's core
        os.sched_setaffinity(0, a.client_cores)
    results: dict[tuple[int, str], list[float]] = {}
    try:
        for rep in range(a.repeat):
            order = a.counts[rep % len(a.counts):] + a.counts[: rep % len(a.counts)]
            for count in order:
                for mode in a.modes:
                    results.setdefault((count, mode), []).append(measure(up[count], count, a.streams, a.tokens, mode))
    finally:
        for server in up.values():
            server.stop()
    print(f"{a.server}, bind {a.bind}, client cores {a.client_cores or 'any'}, {a.streams} streams x {a.tokens} tokens, {a.repeat} interleaved repetitions:")
    for (count, mode), values in sorted(results.items()):
        print(f"  N={count} {mode}: API processes {_summary(values)} us/token")


if __name__ == "__main__":
    main(sys.argv[1:])
