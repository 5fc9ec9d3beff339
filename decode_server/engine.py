"""The one AsyncLLM the server owns: start, limits, live-request registry, abort, shutdown.

The registry maps the request id the *caller* knows to the engine ids serving
it, so `/abort_requests` works with the caller's id whatever the engine uses
inside, and so tests can assert that no per-request state outlives a request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.outputs import RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM

from decode_server.config import STATS_LOG_INTERVAL_S

log = logging.getLogger("decode_server.engine")


@dataclass(frozen=True)
class EngineLimits:
    """What validation needs to know about the engine, read once at start."""

    vocab_size: int
    max_model_len: int
    max_num_seqs: int
    max_logprobs: int
    has_tokenizer: bool


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
        self._seq = itertools.count()
        self._stats_task: asyncio.Task | None = None

    @classmethod
    def start(cls, engine_args: AsyncEngineArgs, tokens_only: bool = False) -> Engine:
        if tokens_only:
            engine_args.tokens_only = True
        vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
        llm = AsyncLLM.from_vllm_config(
            vllm_config,
            usage_context=UsageContext.OPENAI_API_SERVER,
            enable_log_requests=engine_args.enable_log_requests,
            disable_log_stats=engine_args.disable_log_stats,
        )
        return cls(llm, tokens_only)

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
        return self.llm.errored

    # ------------------------------------------------------------ requests

    def live_request_count(self) -> int:
        """Caller requests the server still holds state for (should drop to 0 when idle)."""
        return len(self._live)

    async def generate(
        self,
        caller_id: str,
        token_ids: list[int],
        sampling_params: SamplingParams,
        *,
        cache_salt: str | None = None,
        priority: int = 0,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Run one request; the registry entry lives exactly as long as this generator."""
        # A per-process sequence keeps engine ids unique when callers reuse an id.
        engine_id = f"decode-{next(self._seq)}-{caller_id}"
        prompt = TokensPrompt(prompt_token_ids=token_ids)
        if cache_salt is not None:
            prompt["cache_salt"] = cache_salt
        self._live.setdefault(caller_id, set()).add(engine_id)
        try:
            async for output in self.llm.generate(
                prompt,
                sampling_params,
                engine_id,
                priority=priority,
                reasoning_ended=reasoning_ended,
                reasoning_parser_kwargs=reasoning_parser_kwargs,
            ):
                yield output
        finally:
            ids = self._live.get(caller_id)
            if ids is not None:
                ids.discard(engine_id)
                if not ids:
                    del self._live[caller_id]

    async def abort(self, caller_ids: list[str]) -> list[str]:
        """Abort by the caller's ids; unknown ids are ignored. Returns the engine ids aborted."""
        engine_ids = [eid for cid in caller_ids for eid in self._live.get(cid, ())]
        if engine_ids:
            await self.llm.abort(engine_ids)
        return engine_ids

    async def abort_all(self) -> list[str]:
        return await self.abort(list(self._live))

    async def release_remote_prefill(self, caller_id: str, kv_transfer_params: dict[str, Any] | None) -> None:
        """A decode leg refused before the engine admitted it: have the KV connector tell the
        prefill instance to free the blocks it holds for this request now, not when its lease
        runs out (as vLLM's own OpenAI routes do)."""
        if not kv_transfer_params or not kv_transfer_params.get("do_remote_prefill"):
            return
        if self.llm.vllm_config.kv_transfer_config is None or self.is_dead:
            return
        try:
            await self.llm.notify_kv_transfer_request_rejected(caller_id, kv_transfer_params)
        except Exception:
            log.warning("could not release the remote prefill blocks of rejected request %s", caller_id, exc_info=True)
