"""One generate request end to end, transport-free: validate, start the engine, stack the stages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from vllm.exceptions import VLLMClientError

from decode_server.engine import Engine
from decode_server.fingerprint import HEADER as FINGERPRINT_HEADER
from decode_server.fingerprint import parser_fingerprint
from decode_server.pipeline.derender import DerenderConfig, Derenderer, derender_batch, derender_stream
from decode_server.pipeline.text import with_integer_logprobs, with_text_logprobs
from decode_server.pipeline.tokens import Step, token_steps
from decode_server.respond import ResponseContext, StreamStats, fold_response, stream_chunks
from decode_server.validate import Rejected, build_sampling_params
from protocol.generate import GenerateRequest


@dataclass(frozen=True)
class ServerConfig:
    served_model_names: tuple[str, ...]
    tokens_only: bool = False
    derender: DerenderConfig = field(default_factory=DerenderConfig)


class Generation:
    """A validated request whose engine generator has not started yet."""

    def __init__(self, ctx: ResponseContext, steps: AsyncIterator[Step]):
        self.ctx = ctx
        self.stats = StreamStats()
        self._steps = steps

    def chunks(self) -> AsyncIterator[Any]:
        return stream_chunks(self.ctx, self._steps, self.stats)

    async def response(self) -> Any:
        return await fold_response(self.ctx, self._steps, self.stats)


class GenerateService:
    def __init__(self, engine: Engine, config: ServerConfig):
        self.engine = engine
        self.config = config
        self.derenderer = Derenderer(config.derender, engine.tokenizer, engine.llm.model_config)
        _ = self.derenderer.parser_cls  # a wrong parser name fails at start, not on the first request
        self.fingerprint = parser_fingerprint(
            engine.tokenizer,
            config.served_model_names[0],
            config.derender.reasoning_parser,
            config.derender.tool_call_parser,
        )

    def check_fingerprint(self, sent: str | None) -> None:
        if sent is not None and sent != self.fingerprint:
            raise Rejected(
                f"parser configuration drift: the request was rendered for fingerprint {sent!r}, "
                f"this server's is {self.fingerprint!r} (tokenizer, chat template, parsers or model differ)",
                status=409,
                param=FINGERPRINT_HEADER,
                reason="fingerprint_mismatch",
            )

    def check_model(self, req: GenerateRequest) -> None:
        if req.model is not None and req.model not in self.config.served_model_names:
            raise Rejected(f"The model `{req.model}` does not exist.", status=404, param="model", reason="unknown_model")

    def prepare(self, req: GenerateRequest) -> Generation:
        self.check_model(req)
        engine = self.engine
        sp = build_sampling_params(
            req, engine.limits, tokens_only=self.config.tokens_only, generation_defaults=engine.generation_defaults
        )
        derender_plan = (
            self.derenderer.plan(req.parse_context, req.chat_request) if req.output_mode == "derender" else None
        )
        opts = req.stream_options
        ctx = ResponseContext(
            request_id=req.request_id,
            model=self.config.served_model_names[0],
            output_mode=req.output_mode,
            n=sp.n,
            include_usage=bool(opts and opts.include_usage),
            continuous_usage=bool(opts and opts.include_usage and opts.continuous_usage_stats),
            return_token_ids=bool(req.return_token_ids),
        )
        outputs = engine.generate(
            req.request_id,
            req.token_ids,
            sp,
            cache_salt=req.cache_salt,
            priority=req.priority,
            reasoning_ended=req.reasoning_ended,
            reasoning_parser_kwargs=(
                {"chat_template_kwargs": req.reasoning_parser_kwargs.chat_template_kwargs}
                if req.reasoning_parser_kwargs is not None
                else None
            ),
        )
        steps = token_steps(outputs, keep_text_only=req.output_mode != "tokens")
        if req.output_mode == "tokens":
            steps = with_integer_logprobs(steps, sp.logprobs)
        else:
            steps = with_text_logprobs(steps, sp.logprobs, engine.tokenizer)
        if derender_plan is not None:
            if req.stream:
                steps = derender_stream(steps, derender_plan, req.token_ids, n=sp.n)
            else:
                steps = derender_batch(steps, derender_plan, n=sp.n)
        return Generation(ctx, steps)


def client_error_from_engine(e: BaseException) -> Rejected | None:
    """vLLM's own request validation (raised when the engine admits the request) is the caller's fault."""
    if isinstance(e, VLLMClientError):
        param = getattr(e, "parameter", None)
        return Rejected(str(e), param=param, reason="engine_validation")
    return None
