"""Our abort registry against vLLM's abort rule, over a stub AsyncLLM (no engine, no process): an
abort that arrives before vLLM knows the request (input processing, not yet sent) is remembered and
applied when the request registers; a late one does not abort a retry; what is remembered expires
and is bounded. The same orders on a real engine: tests/engine/decode/test_faults_aborts.py (item 4)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from decode_server.runtime import engine as engine_module

class _GatedLLM:
    """What `Engine` reads of an AsyncLLM, and vLLM's abort rule: a request is unknown (its abort
    dropped) until its input processing ends (`admit` is set) and vLLM registers it."""

    log_stats = False
    errored = False
    tokenizer = None

    def __init__(self) -> None:
        self.model_config = SimpleNamespace(
            model="stub", max_model_len=4096, max_logprobs=20, hf_config=SimpleNamespace(),
            get_diff_sampling_param=dict, get_vocab_size=lambda: 1000,
        )
        self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=4), kv_transfer_config=None)
        self.output_processor = SimpleNamespace(external_req_ids={})
        self.admit = asyncio.Event()
        self.queues: dict[str, asyncio.Queue] = {}
        self.aborted: list[str] = []

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any):
        await self.admit.wait()
        queue: asyncio.Queue = asyncio.Queue()
        self.queues[request_id] = queue
        self.output_processor.external_req_ids[request_id] = [request_id + "-internal"]
        try:
            while True:
                out = await queue.get()
                yield out
                if out.finished:
                    return
        finally:
            self.output_processor.external_req_ids.pop(request_id, None)
            self.queues.pop(request_id, None)

    async def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            if rid in self.output_processor.external_req_ids:  # vLLM drops an abort of an unknown id
                self.aborted.append(rid)
                self.queues[rid].put_nowait(SimpleNamespace(finished=True, finish_reason="abort"))

    def finish(self, request_id: str) -> None:
        self.queues[request_id].put_nowait(SimpleNamespace(finished=True, finish_reason="length"))


def _stub_engine() -> tuple[_GatedLLM, engine_module.Engine]:
    llm = _GatedLLM()
    return llm, engine_module.Engine(llm, tokens_only=True)


async def _run(engine: engine_module.Engine, caller_id: str) -> str:
    from vllm.sampling_params import SamplingParams

    request = engine_module.EngineRequest(caller_id, [1, 2], SamplingParams(max_tokens=5))
    outs = [o async for o in engine.generate(request)]
    return outs[-1].finish_reason


async def _admitted(llm: _GatedLLM, caller_id: str) -> str:
    while True:
        for eid in llm.queues:
            if eid.endswith("-" + caller_id):
                return eid
        await asyncio.sleep(0.001)


async def _runs_unaborted(llm: _GatedLLM, engine: engine_module.Engine, caller_id: str) -> str:
    """`caller_id` sent, admitted, left running a moment (no abort reaches the engine), then finished."""
    task = asyncio.create_task(_run(engine, caller_id))
    eid = await _admitted(llm, caller_id)
    await asyncio.sleep(0.05)
    assert eid not in llm.aborted
    llm.finish(eid)
    return await asyncio.wait_for(task, 2)


@pytest.mark.timeout(30, func_only=True)
def test_an_abort_during_input_processing_is_applied_when_the_engine_admits_the_request():
    async def run() -> None:
        llm, engine = _stub_engine()
        task = asyncio.create_task(_run(engine, "r"))
        while engine.live_request_count() == 0:  # registered here, not yet in the engine
            await asyncio.sleep(0)
        assert len(await engine.abort(["r"])) == 1
        llm.admit.set()
        assert await asyncio.wait_for(task, 2) == "abort"
        assert engine.live_request_count() == 0

    asyncio.run(run())


@pytest.mark.timeout(30, func_only=True)
def test_an_abort_before_the_request_arrives_is_applied_when_it_registers():
    async def run() -> None:
        llm, engine = _stub_engine()
        assert await engine.abort(["s"]) == []  # nothing live yet: remembered, not lost
        llm.admit.set()
        assert await asyncio.wait_for(_run(engine, "s"), 2) == "abort"
        # Used once: the same id afterwards runs.
        task = asyncio.create_task(_run(engine, "s"))
        llm.finish(await _admitted(llm, "s"))
        assert await asyncio.wait_for(task, 2) == "length"

    asyncio.run(run())


@pytest.mark.timeout(30, func_only=True)
def test_a_late_abort_does_not_abort_a_retry_with_the_same_id():
    async def run() -> None:
        llm, engine = _stub_engine()
        llm.admit.set()
        task = asyncio.create_task(_run(engine, "t"))
        llm.finish(await _admitted(llm, "t"))
        assert await task == "length"
        await engine.abort(["t"])  # after its end: late, not early
        assert await _runs_unaborted(llm, engine, "t") == "length"

    asyncio.run(run())


@pytest.mark.timeout(30, func_only=True)
def test_remembered_aborts_expire_and_are_bounded(monkeypatch):
    monkeypatch.setattr(engine_module, "EARLY_ABORT_TTL_S", 0.2)
    monkeypatch.setattr(engine_module, "EARLY_ABORT_MAX_IDS", 100)

    async def run() -> None:
        llm, engine = _stub_engine()
        llm.admit.set()
        await engine.abort([f"x{i}" for i in range(1000)])  # over the cap: the oldest are forgotten
        assert await asyncio.wait_for(_run(engine, "x999"), 2) == "abort"
        assert await _runs_unaborted(llm, engine, "x0") == "length"
        await engine.abort(["late"])
        await asyncio.sleep(0.3)  # past the TTL
        assert await _runs_unaborted(llm, engine, "late") == "length"

    asyncio.run(run())
