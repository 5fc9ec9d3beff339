"""The one AsyncLLM the server owns: start, limits, live-request registry, abort, shutdown.

The registry maps the request id the *caller* knows to the engine ids serving
it, so `/abort_requests` works with the caller's id whatever the engine uses
inside, and so tests can assert that no per-request state outlives a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import select
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs.engine import tokens_input
from vllm.lora.request import LoRARequest
from vllm.outputs import RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM

from decode_server.config import EARLY_ABORT_MAX_IDS, EARLY_ABORT_TTL_S, STATS_LOG_INTERVAL_S
from decode_server.errors import describe
from decode_server.runtime.kv_transfer import is_remote_prefill
from decode_server.runtime.recent_ids import RecentIds

log = logging.getLogger("decode_server.runtime.engine")


class _CoreWatch:
    """Engine core processes this process did not start (pidfds: readable once the process exits)."""

    def __init__(self, pids: list[int]):
        self._poll = select.poll()
        self._gone = False
        for pid in pids:
            try:
                self._poll.register(os.pidfd_open(pid), select.POLLIN)
            except ProcessLookupError:
                self._gone = True

    def exited(self) -> bool:
        self._gone = self._gone or bool(self._poll.poll(0))
        return self._gone


@dataclass(frozen=True)
class EngineLimits:
    """What validation needs to know about the engine, read once at start."""

    vocab_size: int
    max_model_len: int
    max_num_seqs: int
    max_logprobs: int
    has_tokenizer: bool


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """`AsyncLLM.generate`'s per-request keyword arguments, passed through by name: a new one is a
    field here and the line in the service that fills it."""

    priority: int = 0
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    lora_request: LoRARequest | None = None
    trace_headers: Mapping[str, str] | None = None  # W3C trace context, as vLLM reads it
    data_parallel_rank: int | None = None  # X-data-parallel-rank
    session_id: str | None = None  # X-Session-ID

    def as_kwargs(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _OPTION_NAMES}


_OPTION_NAMES = tuple(f.name for f in fields(EngineOptions))


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generate request as the engine takes it, built once by the service."""

    caller_id: str  # the id the caller knows (abort finds the request by it)
    token_ids: list[int]
    sampling_params: SamplingParams
    cache_salt: str | None = None
    aliases: tuple[str, ...] = ()  # further names abort finds it by (the id the response shows)
    options: EngineOptions = field(default_factory=EngineOptions)


def _prompt(request: EngineRequest) -> Any:
    # Rendered input, as vLLM's generate hands it over: AsyncLLM processes it inline instead of
    # queueing a raw prompt on its renderer executor (one worker: a serialisation point).
    return tokens_input(request.token_ids, cache_salt=request.cache_salt)


class EngineStream:
    """One request added for the one-pass consumer: its collector, and what `generate()` does when
    it ends (abort it unless it finished, close the collector, leave the registry)."""

    __slots__ = ("_engine", "collector", "engine_id", "_names")

    def __init__(self, engine: Engine, collector: Any, engine_id: str, names: tuple[str, ...]):
        self._engine, self.collector, self.engine_id, self._names = engine, collector, engine_id, names

    async def abort(self) -> None:
        """As vLLM's `generate()` aborts a request its caller left: by the collector's (internal) id."""
        await self._engine.llm.abort(self.collector.request_id, internal=True)

    def release(self) -> None:
        self.collector.close()
        self._engine._unregister(self.engine_id, self._names)


class Engine:
    def __init__(self, llm: AsyncLLM, tokens_only: bool):
        self.llm = llm
        model_config = llm.model_config
        self.tokenizer = None if tokens_only else llm.tokenizer
        generation_defaults = model_config.get_diff_sampling_param()
        self.limits = EngineLimits(
            vocab_size=model_config.get_vocab_size(),
            max_model_len=model_config.max_model_len,
            max_num_seqs=llm.vllm_config.scheduler_config.max_num_seqs,
            max_logprobs=model_config.max_logprobs,
            has_tokenizer=self.tokenizer is not None,
        )
        self.generation_defaults = generation_defaults
        self._live: dict[str, set[str]] = {}
        # Aborts that found no live request (it may still be in transit), and ids just finished
        # (an abort after the end is late, not early: a retry with the same id must run).
        self._early_aborts = RecentIds(EARLY_ABORT_TTL_S, EARLY_ABORT_MAX_IDS)
        self._finished = RecentIds(EARLY_ABORT_TTL_S, EARLY_ABORT_MAX_IDS)
        self._abort_tasks: set[asyncio.Task] = set()
        self._seq = itertools.count()
        self._stats_task: asyncio.Task | None = None
        self._core_watch: _CoreWatch | None = None

    @classmethod
    def start(
        cls, engine_args: AsyncEngineArgs, tokens_only: bool = False, client: dict[str, Any] | None = None
    ) -> Engine:
        """`client`: with --api-server-count N, this API process's `client_config` from vLLM's
        `APIServerProcessManager` (engine addresses, `client_count`, `client_index`) plus
        `core_pids`, the shared engine core processes; the AsyncLLM is then a client of that core."""
        if tokens_only:
            engine_args.tokens_only = True
        client = dict(client or {})
        core_pids = client.pop("core_pids", ())
        count, index = client.pop("client_count", 1), client.pop("client_index", 0)
        if client:
            engine_args._api_process_count, engine_args._api_process_rank = count, index
        vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
        llm = AsyncLLM.from_vllm_config(
            vllm_config,
            usage_context=UsageContext.OPENAI_API_SERVER,
            enable_log_requests=engine_args.enable_log_requests,
            disable_log_stats=engine_args.disable_log_stats,
            **({"client_addresses": client, "client_count": count, "client_index": index} if client else {}),
        )
        engine = cls(llm, tokens_only)
        engine._core_watch = _CoreWatch(core_pids) if core_pids else None
        return engine

    # ------------------------------------------------------------ lifecycle

    def start_stats_logging(self, interval_s: float = STATS_LOG_INTERVAL_S) -> None:
        """vLLM's own stat loggers flush on `do_log_stats`; vLLM's server calls it periodically."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                await self.llm.do_log_stats()

        if not self.llm.log_stats:
            return
        self._stats_task = asyncio.create_task(loop())

    def shutdown(self) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
        self.llm.shutdown()

    @property
    def is_dead(self) -> bool:
        if self._core_watch is not None and not self.llm.errored and self._core_watch.exited():
            self._core_died()
        return self.llm.errored

    def _core_died(self) -> None:
        """A shared engine core this process does not own exited: what vLLM's own client does when
        a core it launched dies (its MPClient monitor), so open requests fail with EngineDeadError."""
        log.error("the shared engine core exited")
        core = self.llm.engine_core
        core.resources.engine_dead = True
        core.shutdown()

    # ------------------------------------------------------------ requests

    def live_request_count(self) -> int:
        """Engine requests the server still holds state for (should drop to 0 when idle)."""
        return len({eid for ids in self._live.values() for eid in ids})

    def engine_ids(self, name: str) -> set[str]:
        """The engine ids live under `name` (a caller id or an alias)."""
        return set(self._live.get(name, ()))

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Run one request through vLLM's `generate()`; the registry entry lives exactly as long as
        this generator."""
        engine_id, names = self._register(request)
        try:
            async for output in self.llm.generate(
                _prompt(request), request.sampling_params, engine_id, **request.options.as_kwargs()
            ):
                yield output
        finally:
            self._unregister(engine_id, names)

    async def open(self, request: EngineRequest) -> EngineStream:
        """Add one request and hand back its output collector (what `generate()` loops over), for
        the one-pass consumer; the registry entry lives until the stream is released."""
        engine_id, names = self._register(request)
        try:
            collector = await self.llm.add_request(
                engine_id, _prompt(request), request.sampling_params, **request.options.as_kwargs()
            )
        except BaseException:
            self._unregister(engine_id, names)
            raise
        return EngineStream(self, collector, engine_id, names)

    def _register(self, request: EngineRequest) -> tuple[str, tuple[str, ...]]:
        caller_id = request.caller_id
        # A per-process sequence keeps engine ids unique when callers reuse an id.
        engine_id = f"decode-{next(self._seq)}-{caller_id}"
        # Abort finds the request by the id the caller sent or by any alias the response showed.
        names = (caller_id, *request.aliases)
        for name in names:
            self._live.setdefault(name, set()).add(engine_id)
        if any([self._early_aborts.pop(name) for name in names]):  # its abort came first
            self._abort_when_admitted(caller_id, engine_id)
        return engine_id, names

    def _unregister(self, engine_id: str, names: tuple[str, ...]) -> None:
        for name in names:
            ids = self._live.get(name)
            if ids is not None:
                ids.discard(engine_id)
                if not ids:
                    del self._live[name]
            self._finished.add(name)

    def knows(self, caller_id: str) -> bool:
        """Whether this process holds a request by that name, or just finished one."""
        return caller_id in self._live or caller_id in self._finished

    async def abort(self, caller_ids: list[str], remember: bool = True) -> list[str]:
        """Abort by the caller's ids. Returns the engine ids aborted. An id with no live request
        (nor one just finished) is remembered for EARLY_ABORT_TTL_S (unless `remember` is False):
        its request may still be in transit, and is then aborted as soon as it registers."""
        engine_ids = list(dict.fromkeys(eid for cid in caller_ids for eid in self._live.get(cid, ())))
        for cid in caller_ids:
            if remember and not self.knows(cid):
                self._early_aborts.add(cid)
        admitted = [eid for eid in engine_ids if self._admitted(eid)]
        for eid in engine_ids:
            if eid not in admitted:
                self._abort_when_admitted(next(c for c in caller_ids if eid in self._live.get(c, ())), eid)
        if admitted:
            await self.llm.abort(admitted)
        return engine_ids

    def _admitted(self, engine_id: str) -> bool:
        """Whether vLLM holds the request yet: it drops an abort of one still in input processing."""
        known = getattr(getattr(self.llm, "output_processor", None), "external_req_ids", None)
        return known is None or engine_id in known

    def _abort_when_admitted(self, name: str, engine_id: str) -> None:
        """Abort `engine_id` the moment vLLM admits it (or forget it if it ends first)."""

        async def wait_then_abort() -> None:
            try:
                while not self._admitted(engine_id):
                    if engine_id not in self._live.get(name, ()):
                        return
                    await asyncio.sleep(0.005)
                await self.llm.abort([engine_id])
            except Exception:
                log.warning("could not abort request %s", engine_id, exc_info=True)

        task = asyncio.ensure_future(wait_then_abort())
        self._abort_tasks.add(task)
        task.add_done_callback(self._abort_tasks.discard)

    async def abort_all(self) -> list[str]:
        return await self.abort(list(self._live))

    def pulls_remote_kv(self, kv_transfer_params: Any) -> bool:
        """A decode leg that this engine's KV connector will pull from a prefill instance."""
        return is_remote_prefill(kv_transfer_params) and self.llm.vllm_config.kv_transfer_config is not None

    @contextlib.asynccontextmanager
    async def released_if_refused(self, caller_id: str, kv_transfer_params: Any) -> AsyncIterator[None]:
        """Around what runs before a decode leg's answer starts: refused there (a 4xx, or its
        client gone), the KV connector tells the prefill instance to free the blocks it holds for
        this request now, not when its lease runs out (as vLLM's own OpenAI routes do)."""
        if not self.pulls_remote_kv(kv_transfer_params):
            yield
            return
        try:
            yield
        except Exception as e:
            if describe(e).status < 500 and not self.is_dead:
                await self._release_remote_prefill(caller_id, kv_transfer_params)
            raise

    async def _release_remote_prefill(self, caller_id: str, kv_transfer_params: dict[str, Any]) -> None:
        try:
            await self.llm.notify_kv_transfer_request_rejected(caller_id, kv_transfer_params)
        except Exception:
            log.warning("could not release the remote prefill blocks of rejected request %s", caller_id, exc_info=True)
