"""The physical limit: the same AsyncLLM, driven in-process with no HTTP.

    python -m bench.inproc --bench-workload W.json --bench-scenarios S.json --bench-out OUT.json \\
        --model DIR <the same vLLM engine flags as the servers>

Builds AsyncLLM exactly as decode-server does (vLLM's own AsyncEngineArgs CLI),
then for each scenario runs N concurrent `generate()` calls with DELTA outputs
and the same SamplingParams the generate bodies carry (max_tokens, skip_special_tokens=False,
the replay script), timestamping every RequestOutput. Latencies and
throughput are computed by the same code as the HTTP load generator
(bench.loadgen.summarize). "Frontend" CPU here is this process (AsyncLLM's
output processing + the driver loop); the engine is its child processes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from bench.loadgen import LoadResult, StreamResult, summarize_load
from bench.measure import CpuMeter, wait_quiet
from bench.workload import Workload


async def _one(llm, prompt_ids: list[int], script: list[int], length: int, req_id: str, res: StreamResult) -> None:
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    sp = SamplingParams(
        max_tokens=length + 16,
        skip_special_tokens=False,
        extra_args={"replay_token_ids": script},
        output_kind=RequestOutputKind.DELTA,
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
    results: list[StreamResult] = []
    issued = 0
    conc, total, length = sc["concurrency"], sc["requests"], sc["length"]

    async def worker(w: int) -> None:
        nonlocal issued
        while issued < total:
            seq = issued
            issued += 1
            res = StreamResult(label="tokens", start=time.perf_counter())
            results.append(res)
            await _one(llm, wl.prompt_ids, wl.script(length, seq), length, f"{tag}-{seq}", res)

    started = time.perf_counter()
    tasks = [asyncio.ensure_future(worker(w)) for w in range(conc)]
    _, pending = await asyncio.wait(tasks, timeout=sc["time_limit_s"])
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return LoadResult(results, started, time.perf_counter(), bool(pending), conc, total)


async def amain(args, engine_args) -> None:
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    wl = Workload.from_json(Path(args.bench_workload).read_text())
    scenarios = json.loads(Path(args.bench_scenarios).read_text())
    vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    llm = AsyncLLM.from_vllm_config(
        vllm_config, usage_context=UsageContext.OPENAI_API_SERVER, disable_log_stats=engine_args.disable_log_stats
    )
    meter = CpuMeter(None)
    import psutil

    me = psutil.Process()
    out = []
    try:
        # Warm-up, as the HTTP systems get.
        warm = {"concurrency": 2, "requests": 2, "length": min(wl.scripts), "time_limit_s": 60}
        await run_scenario(llm, wl, warm, "warmup")
        for i, sc in enumerate(scenarios):
            quiet = wait_quiet(meter, sc.get("quiet_wait_s", 0.0)) if sc.get("quiet_wait_s") else None
            a_front, a_eng = _cpu(me)
            snap_a = meter.snapshot()
            load = await run_scenario(llm, wl, sc, f"s{i}")
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
            out.append({"scenario": sc, "summary": summary, "cpu": cpu, "quiet": quiet, "engine_tokens": summary["output_tokens"]})
            print(f"inproc {sc['name']} L={sc['length']} c={sc['concurrency']}: {summary['output_tok_s']} tok/s", flush=True)
    finally:
        llm.shutdown()
    Path(args.bench_out).write_text(json.dumps(out, indent=1))


def _cpu(me) -> tuple[float, float]:
    from bench.measure import proc_cpu_s

    return proc_cpu_s(me), sum(proc_cpu_s(p) for p in me.children(recursive=True))


def main(argv: list[str] | None = None) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description=__doc__)
    parser.add_argument("--bench-workload", required=True)
    parser.add_argument("--bench-scenarios", required=True)
    parser.add_argument("--bench-out", required=True)
    AsyncEngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    try:
        import uvloop

        uvloop.run(amain(args, engine_args))
    except ImportError:
        asyncio.run(amain(args, engine_args))


if __name__ == "__main__":
    main(sys.argv[1:])
