"""The two frontends alone, in one process: ours against vLLM's own API server, same engine client.

    python -m bench.frontend_inproc [--repeat 5] [--streams 8,32,64] [--length 256] [--out DIR]

Both apps run in this process over vLLM's own AsyncLLM whose engine core is the test tier's scripted
core (tests/support/scripted_engine): vLLM's InputProcessor, OutputProcessor, incremental detokenizer
and output handler are real; the steps come from the bench's token scripts, one engine step per
request per loop turn, in lockstep with the readers (so neither server merges steps). Requests go
through httpx's ASGI transport (tests/support/asgi_stream.py), chunk by chunk. No engine process, no
sockets, no other process in the measurement: CPU per token is this process's CPU time ÷ the output
tokens received, and other processes do not enter it (they still slow it down: read the interleaved
ratios, not the milliseconds). That makes it the comparison to trust on a shared machine, and a partial one: the socket write per event and uvicorn (half of a frontend's CPU in the
2026-12-01 profiles, docs/benchmarks.md) are not in it; `bench.run` measures those, on real servers.

Per repetition and concurrency: the floor (`AsyncLLM.generate()` on the same engine client, DELTA
outputs, as bench.inproc), then each level pair (tokens vs vLLM's generate tokens, text vs text,
derender vs vLLM's coupled chat stream), ours and vLLM's back to back, which goes first alternating.
OUT/results.json keeps every run; OUT/results.md the medians [min–max] of ours ÷ vLLM and of the
overheads above the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.inproc import run_scenario
from bench.loadgen import Stream, run_load_on
from bench.report import md_table, sp
from bench.scenarios import STREAM_LEVELS, Scenario
from bench.stats import difference, paired, ratio, spread, summarize_load
from bench.workload import Workload

PARSER_FLAGS = ("--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice")
TIME_LIMIT_S = 600.0


def _flags(concurrency: int) -> tuple[str, ...]:
    # later flags win over the test tier's ENGINE_FLAGS: room for every stream at once
    return (*PARSER_FLAGS, "--max-num-seqs", str(max(concurrency, 16)))


def _client(app: Any) -> httpx.AsyncClient:
    from tests.support.asgi_stream import StreamingASGITransport

    return httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://bench.test", timeout=TIME_LIMIT_S)


async def _cpu_per_token(run: Callable[[], Any]) -> dict[str, Any]:
    """One run: this process's CPU time (user + system) and the load's summary."""
    gc.collect()
    cpu0 = time.process_time()
    load = await run()
    cpu_s = time.process_time() - cpu0
    summary = summarize_load(load)
    tokens = summary["output_tokens"]
    return {"summary": summary, "cpu_s": round(cpu_s, 4), "cpu_ms_per_token": round(cpu_s * 1000 / tokens, 5) if tokens else None}


async def _http_run(app: Any, wl: Workload, sc: Scenario) -> Any:
    async with _client(app) as client:
        make: Callable[[int], Stream] = wl.requests_of(sc)
        return await run_load_on(client, make, concurrency=sc.concurrency, requests=sc.requests, time_limit_s=TIME_LIMIT_S)


async def one_concurrency(model_dir: Path, wl: Workload, length: int, c: int, rep: int) -> list[dict[str, Any]]:
    """Every run of one repetition at one concurrency: the floor, then the level pairs."""
    from tests.support.inprocess import serve, vllm_serve

    records = []
    n = 2 * c
    async with serve(model_dir, *_flags(c)) as ours, vllm_serve(model_dir, *_flags(c)) as vllm:
        apps = {"ours": ours.app, "vllm": vllm.app}
        floor = {"concurrency": c, "requests": n, "length": length, "time_limit_s": TIME_LIMIT_S, "level": "tokens", "rep": rep}
        rec = await _cpu_per_token(lambda: run_scenario(ours.llm, wl, floor, f"floor-{c}-{rep}"))
        records.append({"system": "inproc", "level": "tokens", "concurrency": c, "length": length, "rep": rep, **rec})
        order = ("ours", "vllm") if rep % 2 == 0 else ("vllm", "ours")
        for levels in STREAM_LEVELS:
            for system in order:
                level = levels[0] if system == "ours" else levels[1]
                sc = Scenario(system, level, length, c, n, rep=rep)
                rec = await _cpu_per_token(lambda: _http_run(apps[system], wl, sc))
                records.append({"system": system, "level": level, "concurrency": c, "length": length, "rep": rep, **rec})
                s = rec["summary"]
                print(
                    f"[{time.strftime('%H:%M:%S')}] c{c} r{rep} {system} {level}: {s['completed']}/{s['requests']} ok, "
                    f"{rec['cpu_ms_per_token']} ms CPU/token, {s['events_per_token']} events/token",
                    flush=True,
                )
    return records


def valid(r: dict[str, Any]) -> bool:
    s = r["summary"]
    return not s["errors"] and not s["truncated"] and s["completed"] == s["requests"]


def aggregate(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency and level pair: ours ÷ vLLM CPU/token and overhead above the floor, per repetition."""
    def per_rep(system: str, level: str, c: int) -> dict[int, float | None]:
        return {r["rep"]: r["cpu_ms_per_token"] for r in records if (r["system"], r["level"], r["concurrency"]) == (system, level, c) and valid(r)}

    def events(system: str, level: str, c: int) -> dict[str, Any]:
        return spread(r["summary"]["events_per_token"] for r in records if (r["system"], r["level"], r["concurrency"]) == (system, level, c))

    rows = []
    for c in sorted({r["concurrency"] for r in records}):
        floor = per_rep("inproc", "tokens", c)
        for ours_lv, vllm_lv in STREAM_LEVELS:
            o, v = per_rep("ours", ours_lv, c), per_rep("vllm", vllm_lv, c)
            ov_o, ov_v = paired(o, floor, difference), paired(v, floor, difference)
            rows.append({
                "label": f"stream c{c}: {ours_lv} vs {vllm_lv}",
                "cpu_ms_per_token": {"ours": spread(o.values()), "vllm": spread(v.values()), "floor": spread(floor.values())},
                "cpu_ratio": spread(paired(o, v, ratio).values()),
                "overhead_ms_per_token": {"ours": spread(ov_o.values()), "vllm": spread(ov_v.values())},
                "overhead_ratio": spread(paired(ov_o, ov_v, ratio).values()),
                "events_per_token": {"ours": events("ours", ours_lv, c), "vllm": events("vllm", vllm_lv, c)},
            })  # fmt: skip
    return rows


def write_report(out: Path) -> None:
    data = json.loads((out / "results.json").read_text())
    rows = aggregate(data["records"])
    header = [
        "scenario", "CPU/token, ours ÷ vLLM", "overhead above the floor, ours ÷ vLLM", "ours ms/token", "vLLM ms/token",
        "floor ms/token", "events/token, ours / vLLM",
    ]  # fmt: skip
    table = [
        [
            r["label"], sp(r["cpu_ratio"], iqr=True), sp(r["overhead_ratio"]), sp(r["cpu_ms_per_token"]["ours"], 4),
            sp(r["cpu_ms_per_token"]["vllm"], 4), sp(r["cpu_ms_per_token"]["floor"], 4),
            f"{sp(r['events_per_token']['ours'])} / {sp(r['events_per_token']['vllm'])}",
        ]
        for r in rows
    ]  # fmt: skip
    meta = data["meta"]
    lines = [
        f"# Frontends in one process: ours ÷ vLLM's own server ({meta['repeat']} interleaved repetitions), {meta['started']}",
        "",
        f"`python -m bench.frontend_inproc {' '.join(meta['argv'])}` at commit {meta.get('commit')}, vLLM {meta['vllm']}; "
        f"{meta['length']} output tokens per request, 2 × c requests per run; wall {meta.get('duration_s')} s. CPU is this "
        "process's (both apps, vLLM's engine client, the scripted engine core and the client), so each system's ms/token "
        "includes the same engine-client work the floor measures; overhead = system − floor of the same repetition. "
        "No sockets: see the module's docstring for what that leaves out. Median [min–max] over repetitions.",
        "",
        *md_table(header, table),
        "",
    ]
    (out / "results.md").write_text("\n".join(lines))


async def amain(args: argparse.Namespace, argv: list[str]) -> None:
    import subprocess

    import vllm
    from transformers import AutoTokenizer

    from decode_server.tools.demo_model import ensure_demo_model

    model_dir = ensure_demo_model()
    wl = Workload.build(AutoTokenizer.from_pretrained(model_dir), [args.length], args.length)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {
        "started": dt.datetime.now().isoformat(timespec="seconds"), "argv": argv, "commit": commit, "vllm": vllm.__version__,
        "repeat": args.repeat, "length": args.length, "streams": args.streams,
    }  # fmt: skip
    records: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for rep in range(args.repeat):
        for c in args.streams:
            records += await one_concurrency(model_dir, wl, args.length, c, rep)
            (out / "results.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    meta["duration_s"] = round(time.monotonic() - t0, 1)
    (out / "results.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    write_report(out)
    print((out / "results.md").read_text())


def main(argv: list[str] | None = None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32, 64])
    parser.add_argument("--length", type=int, default=256, help="output tokens per request")
    parser.add_argument("--out", default=f"bench/results/{dt.date.today().isoformat()}-frontend-inproc")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(amain(args, argv))


if __name__ == "__main__":
    main()
