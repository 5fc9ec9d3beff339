"""One generate request end to end, transport-free: admission, the engine request, the stage stack.

`generation()` admits a request and yields its `Generation`, which knows whether it streams:
`head()` is the batch body or a stream's first chunk, `rest()` a stream's other chunks. The
output mode's record decides which stages are stacked.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Mapping
from types import SimpleNamespace
from typing import Any

from vllm.entrypoints.generate.base.serving import GenerateBaseServing
from vllm.outputs import RequestOutput

from decode_server.config import ServerConfig
from decode_server.generate.admission import Admission, Admitted
from decode_server.generate.fingerprint import parser_fingerprint
from decode_server.generate.pipeline.derender_plan import Derenderer
from decode_server.generate.pipeline.stats import counted
from decode_server.generate.pipeline.steps import Step
from decode_server.generate.pipeline.tokens import token_steps
from decode_server.generate.pipeline.wire import WireContext, batch_response, stream_chunks
from decode_server.runtime.engine import Engine, EngineOptions, EngineRequest
from decode_server.runtime.kv_transfer import first_token_pending, first_token_within
from decode_server.runtime.lora import Models
from decode_server.runtime.metrics import Metrics
from decode_server.runtime.request_record import RequestRecord, RequestStats


def wire_request_id(caller_id: str) -> str:
    return f"generate-tokens-{caller_id}"


class Generation:
    """An admitted request whose engine generator has not started yet."""

    def __init__(self, request_id: str, ctx: WireContext, steps: AsyncIterator[Step], stats: RequestStats, stream: bool):
        self.request_id = request_id  # the caller's
        self.ctx = ctx
        self.stream = stream
        self.stats = stats
        self._steps = steps
        self._chunks: AsyncIterator[Any] | None = None

    async def head(self) -> Any:
        """What answers first: the batch body, or a stream's first chunk (None: no chunk at all)."""
        if not self.stream:
            return await batch_response(self.ctx, self._steps, self.stats)
        self._chunks = stream_chunks(self.ctx, self._steps, self.stats)
        return await anext(self._chunks, None)

    def rest(self) -> AsyncIterator[Any]:
        """A stream's chunks after its head."""
        assert self._chunks is not None, "a batch request has one body; a stream's rest comes after its head"
        return self._chunks


class GenerateService:
    def __init__(self, engine: Engine, config: ServerConfig, metrics: Metrics):
        self.engine = engine
        self.config = config
        self.metrics = metrics
        derenderer = Derenderer(config.derender, engine.tokenizer, engine.llm.model_config, engine.llm.renderer)
        _ = derenderer.parser_cls  # a wrong parser name fails at start, not on the first request
        self.fingerprint = parser_fingerprint(engine.tokenizer, config.served_model_names[0], config.derender)
        self.models = Models(engine.llm, config.served_model_names, config.lora_modules, config.runtime_lora_updating)
        self.admission = Admission(engine, self.models, derenderer, self.fingerprint, metrics, config.tokens_only)
        # --return-tokens-as-token-ids: `token_id:N` placeholders in text logprobs (no tokenizer), as vLLM.
        self._logprob_tokenizer = None if config.return_tokens_as_token_ids else engine.tokenizer
        self._watch_seq = itertools.count()  # names a remote-prefill request for its deadline
        # vLLM's engine tracing (--otlp-traces-endpoint) is on: a server span per request (tracing.py).
        observability = getattr(engine.llm, "observability_config", None)  # AsyncLLM's; an EngineClient need not have it
        self.tracing = observability is not None and observability.otlp_traces_endpoint is not None

    @contextlib.asynccontextmanager
    async def generation(
        self, body: bytes, headers: Mapping[str, str], record: RequestRecord
    ) -> AsyncIterator[Generation]:
        """The request admitted, its engine request made and its stages stacked. The block is
        admission's: until it ends (the answer starts), a refused decode leg's KV is released."""
        async with self.admission.admitted(body, headers, record) as admitted:
            yield self._generation(admitted, headers, record.span.engine_trace_headers())

    def _generation(self, admitted: Admitted, headers: Mapping[str, str], trace_headers: Mapping[str, str] | None) -> Generation:
        req, mode, sp = admitted.req, admitted.mode, admitted.sampling_params
        stream = bool(req.stream)
        opts = req.stream_options
        ctx = WireContext(
            # vLLM's generate answers with its own engine id for the request.
            request_id=wire_request_id(req.request_id),
            model=self.models.model_name(admitted.lora),
            mode=mode,
            include_usage=bool(stream and opts and opts.include_usage),
            continuous_usage=bool(stream and opts and opts.include_usage and opts.continuous_usage_stats),
            return_token_ids=bool(req.return_token_ids),
            prompt_tokens_details=self.config.prompt_tokens_details,
        )
        steps = token_steps(self._outputs(admitted, ctx.request_id, headers, trace_headers), keep_text_only=mode.needs_text)
        steps = mode.logprobs(steps, sp, self._logprob_tokenizer)
        if mode.final_stage is not None:
            steps = mode.final_stage(steps, admitted.plan, req.token_ids, sp, stream)
        stats = RequestStats()
        return Generation(req.request_id, ctx, counted(steps, stats, final_only=not stream), stats, stream)

    def _outputs(
        self, admitted: Admitted, wire_id: str, headers: Mapping[str, str], trace_headers: Mapping[str, str] | None
    ) -> AsyncIterator[RequestOutput]:
        """The engine's outputs; a decode leg's first one within its deadline (504), or it ends clearly."""
        kv = admitted.kv_transfer_params
        watch = self._remote_prefill_name(kv)
        aliases = (wire_id,) if watch is None else (wire_id, watch)
        engine = self.engine
        outputs = engine.generate(self._engine_request(admitted, aliases, headers, trace_headers))
        if watch is None:
            return outputs

        def pending() -> bool:
            return first_token_pending(engine.llm, engine.engine_ids(watch))

        def outcome(name: str) -> None:
            self.metrics.remote_prefill.labels(name).inc()

        return first_token_within(outputs, kv, pending, self.config.remote_prefill_timeout_s, outcome)

    def _remote_prefill_name(self, kv: dict[str, Any] | None) -> str | None:
        """A unique alias for a decode leg of a KV-connector engine (None for anything else)."""
        if not self.engine.pulls_remote_kv(kv):
            return None
        return f"remote-prefill-{next(self._watch_seq)}"

    @staticmethod
    def _engine_request(
        admitted: Admitted, aliases: tuple[str, ...], headers: Mapping[str, str], trace_headers: Mapping[str, str] | None
    ) -> EngineRequest:
        """What the engine gets; the headers read as vLLM's generate reads them, with its own readers
        (the trace headers: the server span's, else the caller's)."""
        req = admitted.req
        raw_request = SimpleNamespace(headers=headers)  # what vLLM's readers read of its request
        kwargs = req.reasoning_parser_kwargs
        return EngineRequest(
            caller_id=req.request_id,
            token_ids=req.token_ids,
            sampling_params=admitted.sampling_params,
            cache_salt=req.cache_salt,
            aliases=aliases,
            options=EngineOptions(
                priority=req.priority,
                reasoning_ended=req.reasoning_ended,
                reasoning_parser_kwargs=None if kwargs is None else {"chat_template_kwargs": kwargs.chat_template_kwargs},
                lora_request=admitted.lora,
                trace_headers=trace_headers,
                data_parallel_rank=GenerateBaseServing._get_data_parallel_rank(raw_request),
                session_id=GenerateBaseServing._get_session_id_from_headers(raw_request),
            ),
        )
