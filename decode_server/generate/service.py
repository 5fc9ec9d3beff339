"""One generate request end to end, transport-free: validate, start the engine, stack the stages.

`prepare()` returns a `Generation`, which knows whether it streams: `chunks()` for a stream,
`response()` for a batch body. The output mode decides how many stages are stacked.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams

from decode_server.config import ServerConfig
from decode_server.runtime.engine import Engine
from decode_server.errors import Rejected
from decode_server.generate.fingerprint import HEADER as FINGERPRINT_HEADER
from decode_server.generate.fingerprint import parser_fingerprint
from decode_server.runtime.lora import Models
from decode_server.generate.pipeline.derender import derender_batch, derender_stream
from decode_server.generate.pipeline.derender_plan import DerenderPlan, Derenderer
from decode_server.generate.pipeline.logprobs import chat_top_count, with_integer_logprobs, with_text_logprobs
from decode_server.generate.pipeline.steps import Step
from decode_server.generate.pipeline.tokens import token_steps
from decode_server.generate.pipeline.wire import RequestStats, WireContext, batch_response, stream_chunks
from decode_server.runtime.kv_transfer import first_token_pending, first_token_within, is_remote_prefill
from decode_server.generate.rules import as_tokens_prefill_leg, build_sampling_params, is_prefill_leg, kv_transfer_params_of
from protocol.generate import GenerateRequest


def wire_request_id(caller_id: str) -> str:
    return f"generate-tokens-{caller_id}"


class Generation:
    """A validated request whose engine generator has not started yet."""

    def __init__(self, ctx: WireContext, steps: AsyncIterator[Step], stream: bool):
        self.ctx = ctx
        self.stream = stream
        self.stats = RequestStats()
        self._steps = steps

    def chunks(self) -> AsyncIterator[Any]:
        assert self.stream, "a batch request has one response, not chunks"
        return stream_chunks(self.ctx, self._steps, self.stats)

    async def response(self) -> Any:
        assert not self.stream, "a stream request has chunks, not one response"
        return await batch_response(self.ctx, self._steps, self.stats)


class GenerateService:
    def __init__(self, engine: Engine, config: ServerConfig):
        self.engine = engine
        self.config = config
        self.derenderer = Derenderer(config.derender, engine.tokenizer, engine.llm.model_config)
        _ = self.derenderer.parser_cls  # a wrong parser name fails at start, not on the first request
        self.fingerprint = parser_fingerprint(engine.tokenizer, config.served_model_names[0], config.derender)
        self.models = Models(engine.llm, config.served_model_names, config.lora_modules, config.runtime_lora_updating)
        self._watch_seq = itertools.count()  # names a remote-prefill request for its deadline

    def answered_as(self, req: GenerateRequest) -> GenerateRequest:
        """The request this server answers. Without a tokenizer (`--tokens-only`), a P/D router's
        prefill leg (`validate.is_prefill_leg`) is answered as a tokens-level prefill, whatever
        decode-only fields llm-d's sidecar left on it; anything else as sent, failing loud later."""
        if self.engine.limits.has_tokenizer or not is_prefill_leg(req):
            return req
        return as_tokens_prefill_leg(req)

    def check_fingerprint(self, sent: str | None, req: GenerateRequest | None = None) -> None:
        # Without a tokenizer the fingerprint cannot match a decode pool's (it hashes no vocabulary):
        # a prefill leg, whose answer never reaches the client, leaves the check to its decode leg.
        if req is not None and not self.engine.limits.has_tokenizer and is_prefill_leg(req):
            return
        if sent is not None and sent != self.fingerprint:
            raise Rejected(
                f"parser configuration drift: the request was rendered for fingerprint {sent!r}, "
                f"this server's is {self.fingerprint!r} (tokenizer, chat template, parsers or model differ)",
                status=409,
                param=FINGERPRINT_HEADER,
                reason="fingerprint_mismatch",
            )

    async def check_model(self, req: GenerateRequest) -> LoRARequest | None:
        """The adapter `model` names (None: the base model, also for "" or absent); unknown: 404."""
        return await self.models.resolve(req.model)

    async def prepare(self, req: GenerateRequest, **engine_headers: Any) -> Generation:
        """`engine_headers`: what vLLM's generate reads from the request's headers for the engine
        (`trace_headers`, `data_parallel_rank`, `session_id`), passed to `Engine.generate`."""
        lora = await self.check_model(req)
        engine = self.engine
        sp = build_sampling_params(
            req, engine.limits, tokens_only=self.config.tokens_only, generation_defaults=engine.generation_defaults
        )
        plan = self.derenderer.plan(req.parse_context, req.chat_request) if req.output_mode == "derender" else None
        stream = bool(req.stream)
        opts = req.stream_options
        ctx = WireContext(
            # vLLM's generate answers with its own engine id for the request.
            request_id=wire_request_id(req.request_id),
            model=self.models.model_name(lora),
            output_mode=req.output_mode,
            include_usage=bool(stream and opts and opts.include_usage),
            continuous_usage=bool(stream and opts and opts.include_usage and opts.continuous_usage_stats),
            return_token_ids=bool(req.return_token_ids),
            prompt_tokens_details=self.config.prompt_tokens_details,
        )
        kv = kv_transfer_params_of(req)
        watch = self._remote_prefill_name(kv)
        outputs = engine.generate(
            req.request_id,
            req.token_ids,
            sp,
            aliases=(ctx.request_id,) if watch is None else (ctx.request_id, watch),
            cache_salt=req.cache_salt,
            priority=req.priority,
            reasoning_ended=req.reasoning_ended,
            reasoning_parser_kwargs=(
                {"chat_template_kwargs": req.reasoning_parser_kwargs.chat_template_kwargs}
                if req.reasoning_parser_kwargs is not None
                else None
            ),
            lora_request=lora,
            **engine_headers,
        )
        if watch is not None:  # a decode leg: its KV arrives within the deadline, or it ends clearly
            outputs = first_token_within(outputs, kv, lambda: first_token_pending(engine.llm, engine.engine_ids(watch)))
        steps = self._stages(token_steps(outputs, keep_text_only=req.output_mode != "tokens"), req, sp, plan)
        return Generation(ctx, steps, stream)

    def _remote_prefill_name(self, kv: dict[str, Any] | None) -> str | None:
        """A unique alias for a decode leg of a KV-connector engine (None for anything else)."""
        if not is_remote_prefill(kv) or self.engine.llm.vllm_config.kv_transfer_config is None:
            return None
        return f"remote-prefill-{next(self._watch_seq)}"

    def _stages(
        self, steps: AsyncIterator[Step], req: GenerateRequest, sp: SamplingParams, plan: DerenderPlan | None
    ) -> AsyncIterator[Step]:
        """Stack only the stages this request needs, in the pipeline's order."""
        num_top = sp.logprobs
        # --return-tokens-as-token-ids: `token_id:N` placeholders (no tokenizer), as vLLM.
        tokenizer = None if self.config.return_tokens_as_token_ids else self.engine.tokenizer
        if req.output_mode == "derender" and (num_top is not None or sp.logprob_token_ids):
            # The derender level answers as coupled chat: chat's top-k cut.
            steps = with_text_logprobs(steps, num_top, tokenizer, chat_top_count(num_top, bool(sp.logprob_token_ids)))
        elif num_top is not None:
            if req.output_mode == "tokens":
                steps = with_integer_logprobs(steps, num_top)
            else:
                steps = with_text_logprobs(steps, num_top, tokenizer)
        if plan is not None:
            steps = derender_stream(steps, plan, req.token_ids, sp) if req.stream else derender_batch(steps, plan)
        return steps

    async def release_remote_prefill(self, req: GenerateRequest | None) -> None:
        if req is not None and isinstance(req.request_id, str):
            # Top level or sampling_params.extra_args (llm-d's coordinator), as the engine reads them.
            await self.engine.release_remote_prefill(req.request_id, kv_transfer_params_of(req))
