"""Frontend CPU per token with --api-server-count N (a measurement, not a test: no assertions).

    .venv/bin/python -m tests.measure_scale_out_cpu [--counts 1 2] [--streams 8] [--tokens 512]

Starts `decode-server serve` on the demo model once per N, sends `--streams` concurrent streams of
`--tokens` tokens each (ignore_eos), and reports the CPU seconds (user+system, psutil) the API
processes used during the load: with N=1 the server process itself (not its engine core child),
with N>1 each API process (its `APIServer_i` process title) and the parent; and the engine core's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from decode_server.demo_model import build_demo_model
from tests import servers
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


def measure(which: str, count: int, streams: int, tokens: int, modes: list[str], model: Path, logs: Path) -> None:
    flags = ["--api-server-count", str(count), "--max-num-seqs", str(max(streams, 16))]
    if which == "ours":
        server = servers.ours(f"cpu-{which}-{count}", model, logs, *flags)
    else:  # `vllm serve`'s own code (only its CLI runs several API processes; the console script is broken here)
        server = servers.vllms_own(f"cpu-{which}-{count}", model, logs, *flags)
        server.argv[1:3] = ["-c", _VLLM_SERVE]
    server.start()
    try:
        api, cores = _pids(server.proc.pid, count)
        parent = [server.proc.pid] if count > 1 else []
        idle0 = _cpu(api)
        time.sleep(5)
        idle_s = sum(_cpu(api).values()) - sum(idle0.values())
        for mode in modes:
            asyncio.run(_load(server.url, streams, 16, mode))  # warm up
            before, t0 = _cpu(api + cores + parent), time.monotonic()
            total = asyncio.run(_load(server.url, streams, tokens, mode))
            after, wall = _cpu(api + cores + parent), time.monotonic() - t0
            used = {pid: after[pid] - before[pid] for pid in after}
            api_s = sum(used[p] for p in api)
            core_s, parent_s = sum(used[p] for p in cores), sum(used[p] for p in parent)
            per = ", ".join(f"{used[p]:.2f}" for p in api)
            print(f"{which} N={count} {mode}: {total} tokens in {wall:.1f}s; API processes {api_s:.2f} CPU-s "
                  f"= {1e6 * api_s / total:.0f} us/token (each: {per}; idle {idle_s / 5:.3f} CPU-s/s in all); "
                  f"engine core {1e6 * core_s / total:.0f} us/token; parent {parent_s:.2f}s", flush=True)
    finally:
        server.stop()


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--counts", type=int, nargs="+", default=[1, 2])
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--modes", nargs="+", default=["tokens", "text"])
    p.add_argument("--server", choices=["ours", "vllm"], default="ours", help="vllm: vLLM's own server, for comparison")
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="scale-out-cpu-"))
    model = build_demo_model(tmp / "model")
    for count in a.counts:
        measure(a.server, count, a.streams, a.tokens, a.modes, model, tmp)


if __name__ == "__main__":
    main(sys.argv[1:])
