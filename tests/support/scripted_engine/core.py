"""The scripted engine core: vLLM's engine-core client, answered in this process.

It stands where `AsyncLLM.engine_core` (the client of the engine process) stands, so everything
above it is vLLM's own code: the InputProcessor, the OutputProcessor (incremental detokenizer, stop
strings, output kinds, the n>1 fan-out, abort outputs), the output handler and the stat loggers.
A step does what vLLM's scheduler does with a model runner's output: admit waiting requests up to
max_num_seqs, append each running request's next tokens, stop them with vLLM's `check_stop`, and
send one `EngineCoreOutput` per request that advanced.

Test hooks: `hold` (requests stay queued), `fail` (finish_reason "error"), `die` (EngineDeadError
for every open request, the engine `errored`), `tokens_per_step`, `step_interval_s`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from vllm.lora.request import LoRARequest
from vllm.v1.core.sched.utils import check_stop
from vllm.v1.engine import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from vllm.v1.engine.core_client import EngineCoreClient
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.request import Request, RequestStatus

from tests.support.scripted_engine.model import ScriptedModel

Match = str | Callable[[str], bool]


def matcher(match: Match) -> Callable[[str], bool]:
    """A request's external id (ours: `decode-<n>-<caller id>`) matches a string equal to it or to
    its last `-`-separated part(s): "req-1" matches "decode-0-req-1", not "decode-0-req-10"."""
    if callable(match):
        return match
    return lambda external_id: external_id == match or external_id.endswith("-" + match)


@dataclass
class Gate:
    """Matching requests make no progress once they have `after_tokens` output tokens (0: they stay
    queued, status WAITING; more: they run that far, then get no tokens) until `release()`."""

    matches: Callable[[str], bool]
    after_tokens: int
    core: ScriptedCore
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def holds(self, live: _Live) -> bool:
        return self.matches(live.external_id) and live.request.num_output_tokens >= self.after_tokens

    async def reached(self, timeout_s: float = 10.0) -> None:
        """Until a matching request is held (queued, or at `after_tokens`)."""
        await asyncio.wait_for(self.arrived.wait(), timeout_s)

    def release(self) -> None:
        if self in self.core._gates:
            self.core._gates.remove(self)
            self.core._wake()


@dataclass
class _Failure:
    matches: Callable[[str], bool]
    after_tokens: int


@dataclass
class _Live:
    request: Request
    external_id: str
    replay: tuple[Any, ...]
    prefilled: bool = False


class ScriptedCore(EngineCoreClient):
    def __init__(self, vllm_config: Any, log_stats: bool, model: ScriptedModel | None = None):
        self.model = model or ScriptedModel(vllm_config)
        self.log_stats = log_stats
        self.max_model_len = vllm_config.model_config.max_model_len
        self.max_num_seqs = vllm_config.scheduler_config.max_num_seqs
        # Chunking: tokens each running request gets per engine step (1 on a plain engine).
        self.tokens_per_step = 1
        self.step_interval_s = 0.0
        # Each step waits until every stream took its previous output (so a stream gets one
        # RequestOutput per step), at most this long for a reader that stalls; None: however long
        # that takes, for readers that all read to their end (a loaded machine may not run a
        # reader for seconds, and an output it has not taken merges with the next step's).
        self.lockstep_timeout_s: float | None = 1.0
        # vLLM's EngineCore labels every step with its weight version (outputs carry the spans).
        self.weight_version = "default"
        # What a finished request's KV connector hands back (None: no connector, as the demo runs).
        self.finished_kv_transfer_params: Callable[[Request], dict[str, Any] | None] = lambda request: None
        self.cached_tokens: Callable[[Request], int] = lambda request: 0
        # What reached the engine, for tests to read: every request, the aborted internal ids,
        # the pre-aborted requests that release a remote prefill's blocks, the LoRA adapters.
        self.seen: list[EngineCoreRequest] = []
        self.aborted: list[str] = []
        self.released_kv: list[EngineCoreRequest] = []
        self.loras: dict[int, LoRARequest] = {}
        # The client interface vLLM's AsyncLLM and our Engine read.
        self.resources = SimpleNamespace(engine_dead=False)
        self.engine_ranks_managed = [0]
        self._waiting: list[_Live] = []
        self._running: list[_Live] = []
        self._gates: list[Gate] = []
        self._failures: list[_Failure] = []
        self._stats_changed = False
        self._wakeup = asyncio.Event()
        self._output_processor: Any = None

    def attach(self, output_processor: Any) -> None:
        """The AsyncLLM's OutputProcessor: a step waits until its streams took their last output."""
        self._output_processor = output_processor

    # ------------------------------------------------------------ test hooks

    def hold(self, match: Match, after_tokens: int = 0) -> Gate:
        gate = Gate(matcher(match), after_tokens, self)
        self._gates.append(gate)
        self._note_held()
        return gate

    def fail(self, match: Match, after_tokens: int = 0) -> None:
        """Matching requests finish with finish_reason "error" at their first step with at least
        `after_tokens` output tokens (0: before any token, as a failed KV load)."""
        self._failures.append(_Failure(matcher(match), after_tokens))
        self._wake()

    def die(self) -> None:
        """The engine core process is gone: what the client sees when its output socket says so."""
        self.resources.engine_dead = True
        self._wake()

    @property
    def waiting(self) -> list[str]:
        return [live.external_id for live in self._waiting]

    @property
    def running(self) -> list[str]:
        return [live.external_id for live in self._running]

    # ------------------------------------------------------------ the client interface

    def shutdown(self, timeout: float | None = None) -> None:
        self.die()

    def dp_engines_running(self) -> bool:
        return bool(self._waiting or self._running)

    async def get_supported_tasks_async(self) -> tuple[str, ...]:
        return ("generate",)

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        if self.resources.engine_dead:
            raise EngineDeadError()
        self.seen.append(request)
        if request.abort_immediately:  # only its connector hook runs: nothing to generate
            self.released_kv.append(request)
            return
        req = Request.from_engine_core_request(request, block_hasher=None)
        if self.log_stats:
            req.record_event(EngineCoreEventType.QUEUED)
        live = _Live(req, request.external_req_id or request.request_id, self.model.replay_state(req))
        self._waiting.append(live)
        self._note_held()
        self._changed()

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        for queue in (self._waiting, self._running):
            for live in [live for live in queue if live.request.request_id in ids]:
                queue.remove(live)
                live.request.status = RequestStatus.FINISHED_ABORTED
                self.aborted.append(live.request.request_id)
                self._changed()

    async def set_weight_version_async(self, weight_version: str) -> None:
        self.weight_version = weight_version

    async def get_weight_version_async(self) -> str:
        return self.weight_version

    async def add_lora_async(self, lora_request: LoRARequest) -> bool:
        self.loras[lora_request.lora_int_id] = lora_request
        return True

    async def remove_lora_async(self, lora_id: int) -> bool:
        return self.loras.pop(lora_id, None) is not None

    async def list_loras_async(self) -> set[int]:
        return set(self.loras)

    async def pin_lora_async(self, lora_id: int) -> bool:
        return lora_id in self.loras

    async def get_output_async(self) -> EngineCoreOutputs:
        while True:
            if self.resources.engine_dead:
                raise EngineDeadError()
            self._admit()
            if any(not self._held(live) for live in self._running):
                await self._pace()
                if not self.resources.engine_dead:
                    stepping = [live for live in self._running if not self._held(live)]
                    outputs = [self._advance(live) for live in stepping]
                    self._note_held()
                    return self._outputs(outputs)
            elif self._stats_changed:
                return self._outputs([])
            else:
                self._wakeup.clear()
                await self._wakeup.wait()

    # ------------------------------------------------------------ one step

    def _wake(self) -> None:
        self._wakeup.set()

    def _changed(self) -> None:
        self._stats_changed = True
        self._wake()

    def _held(self, live: _Live) -> bool:
        return any(gate.holds(live) for gate in self._gates)

    def _note_held(self) -> None:
        for gate in self._gates:
            if any(gate.holds(live) for live in self._waiting + self._running):
                gate.arrived.set()

    def _admit(self) -> None:
        """First come, first served, up to max_num_seqs; a held request keeps its place."""
        for live in list(self._waiting):
            if len(self._running) >= self.max_num_seqs:
                return
            if self._held(live):
                continue
            self._waiting.remove(live)
            req = live.request
            req.status = RequestStatus.RUNNING
            if self.log_stats:
                req.record_event(EngineCoreEventType.SCHEDULED)
            if req.prefill_stats is not None:
                req.prefill_stats.set(req.num_prompt_tokens, self.cached_tokens(req), 0)
            self._running.append(live)
            self._changed()

    async def _pace(self) -> None:
        await asyncio.sleep(self.step_interval_s)
        deadline = None if self.lockstep_timeout_s is None else time.monotonic() + self.lockstep_timeout_s
        spins = 0
        while self._undelivered() and not self.resources.engine_dead and (deadline is None or time.monotonic() < deadline):
            spins += 1
            await asyncio.sleep(0 if spins < 50 else 0.001)

    def _undelivered(self) -> bool:
        if self._output_processor is None:
            return False
        states = self._output_processor.request_states
        for live in self._running:
            state = states.get(live.request.request_id)
            if state is not None and state.queue is not None and state.queue.output is not None:
                return True
        return False

    def _outputs(self, outputs: list[EngineCoreOutput]) -> EngineCoreOutputs:
        self._stats_changed = False
        stats = None
        if self.log_stats:
            stats = SchedulerStats(num_running_reqs=len(self._running), num_waiting_reqs=len(self._waiting))
        return EngineCoreOutputs(
            outputs=outputs, scheduler_stats=stats, timestamp=time.monotonic(), weight_version=self.weight_version
        )

    def _failing(self, live: _Live) -> bool:
        n = live.request.num_output_tokens
        return any(f.matches(live.external_id) and n >= f.after_tokens for f in self._failures)

    def _advance(self, live: _Live) -> EngineCoreOutput:
        req = live.request
        if self._failing(live):
            req.status = RequestStatus.FINISHED_ERROR
            self._finish(live)
            return EngineCoreOutput(
                request_id=req.request_id,
                new_token_ids=[],
                finish_reason=req.get_finished_reason(),
                events=req.take_events(),
                trace_headers=req.trace_headers,
            )
        prompt_logprobs = prefill_stats = None
        if not live.prefilled:  # the prefill step samples the first token too
            live.prefilled = True
            prompt_logprobs = self.model.prompt_logprobs(req)
            prefill_stats = req.take_prefill_stats()
            if prefill_stats is not None:
                prefill_stats.finalize(prefill_stats.num_cached_tokens)
        new_token_ids, stopped = self._sample(live)
        kv_transfer_params = None
        if stopped:
            kv_transfer_params = self.finished_kv_transfer_params(req)
            self._finish(live)
        return EngineCoreOutput(
            request_id=req.request_id,
            new_token_ids=new_token_ids,
            finish_reason=req.get_finished_reason() if stopped else None,
            new_logprobs=self.model.sample_logprobs(req, new_token_ids),
            new_prompt_logprobs_tensors=prompt_logprobs,
            stop_reason=req.stop_reason,
            events=req.take_events(),
            kv_transfer_params=kv_transfer_params,
            prefill_stats=prefill_stats,
            trace_headers=req.trace_headers,
        )

    def _sample(self, live: _Live) -> tuple[list[int], bool]:
        """This step's tokens, appended and stop-checked one by one as vLLM's scheduler does (a gate
        stops the step where it holds)."""
        new_token_ids: list[int] = []
        for _ in range(self.tokens_per_step):
            if new_token_ids and self._held(live):
                break
            token = self.model.next_token(live.replay)
            live.request.append_output_token_ids(token)
            new_token_ids.append(token)
            if check_stop(live.request, self.max_model_len):
                return new_token_ids, True
        return new_token_ids, False

    def _finish(self, live: _Live) -> None:
        self._running.remove(live)
        self._changed()
