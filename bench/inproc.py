"""The physical limit (the "floor"): the same AsyncLLM, driven in-process with no HTTP.

    python -m bench.inproc --bench-workload W.json --bench-serve DIR --model DIR <engine flags>

Builds AsyncLLM exactly as decode-server does (vLLM's own AsyncEngineArgs CLI), then per
scenario runs N concurrent `generate()` calls with the same SamplingParams the generate
bodies carry (max_tokens, skip_special_tokens=False, the replay script; the same prompt
token ids, `Workload.prompt(prompt_len, rep, seq)`) and DELTA outputs (a scenario with
`"batch": true`: FINAL_ONLY, one output per request, as a non-streaming server request
gets), timestamping every RequestOutput. Latencies and throughput are computed by the same
code as for the HTTP load generator (bench.stats). "Frontend" CPU here is this process
(AsyncLLM's output processing + the driver loop); the engine is its child processes.

It stays up between the servers' runs: it writes `DIR/ready` after warm-up, then reads one
scenario JSON per line from stdin and writes each result to `DIR/<name>.json`; EOF ends it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.loadgen import LoadResult, StreamResult, arun, keep_in_flight
from bench.measure import CpuMeter, proc_cpu_s
from bench.stats import summarize_load
from bench.workload import Workload


async def _one(
    llm, prompt_ids: list[int], script: list[int], length: int, req_id: str, res: StreamResult, batch: bool, detokenize: bool = True
) -> None:
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    sp = SamplingParams(
        max_tokens=length + 16,
        skip_special_tokens=False,
        detokenize=detokenize,
        extra_args={"replay_token_ids": script},
        output_kind=RequestOutputKind.FINAL_ONLY if batch else RequestOutputKind.DELTA,
    )
    res.start = time.perf_counter()
    try:
        async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt_ids), sp, req_id):
            now = time.perf_counter()
            res.events += 1
            n = sum(len(o.token_ids) for o in out.outputs)
            if n:
                res.times.append(now)
                res.ntoks.append(n)
            for o in out.outputs:
                if o.finish_reason:
                    res.finish_reason = o.finish_reason
        res.end = time.perf_counter()
    except asyncio.CancelledError:
        res.error = "cancelled (time limit)"
        await llm.abort(req_id)
        raise
    except Exception as e:
        res.error = f"{type(e).__name__}: {e}"[:300]


async def run_scenario(llm, wl: Workload, sc: dict, tag: str) -> LoadResult:
    length, batch = sc["length"], bool(sc.get("batch"))
    prompt_len, rep = sc.get("prompt_len") or 0, sc.get("rep")
    detokenize = sc.get("level") != "nodetok"

    def one(seq: int, res: StreamResult):
        return _one(llm, wl.prompt(prompt_len, rep, seq), wl.script(length, seq), length, f"{tag}-{seq}", res, batch, detokenize)

    return await keep_in_flight(one, sc["concurrency"], sc["requests"], sc["time_limit_s"])


def _cpu(me) -> tuple[float, float]:
    return proc_cpu_s(me), sum(proc_cpu_s(p) for p in me.children(recursive=True))


async def measure(llm, wl: Workload, sc: dict, tag: str, meter: CpuMeter, me) -> dict[str, Any]:
    """One scenario with its CPU accounting: {scenario, summary, cpu, quiet, engine_tokens}."""
    a_front, a_eng = _cpu(me)
    snap_a = meter.snapshot()
    load = await run_scenario(llm, wl, sc, tag)
    snap_b = meter.snapshot()
    b_front, b_eng = _cpu(me)
    cpu = CpuMeter.delta(snap_a, snap_b)
    # In this process the "bench" share *is* the frontend: report it as such.
    cpu["frontend_cpu_s"] = round(b_front - a_front, 4)
    cpu["engine_cpu_s"] = round(b_eng - a_eng, 4)
    cpu["bench_client_cpu_s"] = 0.0
    cpu["foreign_cpu_s"] = max(0.0, round(cpu["foreign_cpu_s"] - (b_eng - a_eng), 3))
    cpu["foreign_cores"] = round(cpu["foreign_cpu_s"] / cpu["wall_s"], 3) if cpu["wall_s"] else None
    summary = summarize_load(load)
    print(f"inproc {sc['name']} L={sc['length']} c={sc['concurrency']}: {summary['output_tok_s']} tok/s", flush=True)
    return {"scenario": sc, "summary": summary, "cpu": cpu, "engine_tokens": summary["output_tokens"]}


async def _warm_up(llm, wl: Workload) -> None:
    """Warm-up, as the HTTP systems get (the parent sends the long-prompt warm-ups itself)."""
    for batch in (False, True):
        warm = {"concurrency": 2, "requests": 2, "length": wl.warm_length, "time_limit_s": 60, "batch": batch}
        await run_scenario(llm, wl, warm, f"warmup{int(batch)}")


async def _serve(llm, wl: Workload, work: Path, meter: CpuMeter, me) -> None:
    work.mkdir(parents=True, exist_ok=True)
    await _warm_up(llm, wl)
    (work / "ready").write_text(str(os.getpid()))
    loop = asyncio.get_running_loop()
    i = 0
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        if not line.strip():
            continue
        sc = json.loads(line)
        item = await measure(llm, wl, sc, f"s{i}", meter, me)
        i += 1
        tmp = work / f".{sc['name']}.json.tmp"
        tmp.write_text(json.dumps(item))
        tmp.rename(work / f"{sc['name']}.json")


async def amain(args, engine_args) -> None:
    import psutil
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    wl = Workload.from_json(Path(args.bench_workload).read_text())
    vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    llm = AsyncLLM.from_vllm_config(
        vllm_config, usage_context=UsageContext.OPENAI_API_SERVER, disable_log_stats=engine_args.disable_log_stats
    )
    try:
        await _serve(llm, wl, Path(args.bench_serve), CpuMeter(None), psutil.Process())
    finally:
        llm.shutdown()


def main(argv: list[str] | None = None) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description=__doc__)
    parser.add_argument("--bench-workload", required=True)
    parser.add_argument("--bench-serve", required=True, help="work directory: take scenarios one per stdin line (see the module doc)")
    AsyncEngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    arun(amain(args, engine_args))


if __name__ == "__main__":
    main(sys.argv[1:])
