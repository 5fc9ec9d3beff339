"""A scripted engine core paused as vLLM 0.33's `EngineCoreProc.pause_generation` pauses it in a mode
that refuses new work ("abort", "wait"): each request added while paused is answered by 0.33's own
`EngineCoreProc._reject_add_while_paused` (a finished output carrying RequestError "engine_paused"),
which AsyncLLM raises as its retryable error. Only 0.33 has it: 0.32's engine queues them."""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Iterator
from types import SimpleNamespace

from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.engine.core import EngineCoreProc
from vllm.v1.request import Request

from tests.support.scripted_engine import ScriptedCore


class _PausedEngineCore:
    """What `EngineCoreProc._reject_add_while_paused` reads of its engine core: paused, refusing new
    requests, with none of them scheduled; its finish outputs go to `output_queue` as the engine's do."""

    reject_new_requests = True
    _send_finish_outputs_to_client = EngineCoreProc._send_finish_outputs_to_client

    def __init__(self) -> None:
        self.output_queue: queue.SimpleQueue[tuple[int, EngineCoreOutputs]] = queue.SimpleQueue()
        self.scheduler = SimpleNamespace(has_request=lambda request_id: False)

    def add_request(self, request: Request) -> None:
        raise AssertionError("a paused engine re-adds only requests with kv_transfer_params; none are sent here")


@contextlib.contextmanager
def paused(core: ScriptedCore) -> Iterator[None]:
    engine = _PausedEngineCore()
    step = core.get_output_async

    async def add_request_async(request) -> None:
        core.seen.append(request)
        rejected = EngineCoreProc._reject_add_while_paused(engine, Request.from_engine_core_request(request, block_hasher=None))
        assert rejected, "vLLM's paused engine accepted a new request"
        core._changed()  # ends a step the output handler is waiting on: its next call takes the rejection

    async def get_output_async() -> EngineCoreOutputs:
        if not engine.output_queue.empty():
            return engine.output_queue.get()[1]
        return await step()

    core.add_request_async, core.get_output_async = add_request_async, get_output_async  # type: ignore[method-assign]
    try:
        yield
    finally:
        del core.add_request_async, core.get_output_async  # the class's methods again
