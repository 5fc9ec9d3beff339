"""One generate request end to end, transport-free: admission, the engine request, the stage stack.

`generation()` admits a request and yields its `Generation`, which knows whether it streams:
`head()` is the batch body or a stream's first events, `rest()` a stream's other events (framed
bytes). The output mode's record decides which stages are stacked. A stream is read by the one
consumer (one_pass.py), or, as a P/D decode leg under its first-token deadline or where the
engine client has no collector to read, by a loop over vLLM's `generate()`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import SimpleNamespace
from typing import Any

from vllm.entrypoints.generate.base.serving import GenerateBaseServing
from vllm.outputs import RequestOutput

from decode_server.compat import step_collectors
from decode_server.config import ServerConfig
from decode_server.generate.admission import Admission, Admitted
from decode_server.generate.fingerprint import parser_fingerprint
from decode_server.generate.one_pass import OnePassStream, StepConsumer
from decode_server.generate.pipeline.derender_plan import Derenderer
from decode_server.generate.pipeline.stats import StepCounter, counted
from decode_server.generate.pipeline.steps import each
from decode_server.generate.pipeline.stream import StreamPipeline, framed_outputs
from decode_server.generate.pipeline.tokens import token_steps
from decode_server.generate.pipeline.wire import StreamWire, WireContext, batch_response
from decode_server.runtime.engine import Engine, EngineOptions, EngineRequest
from decode_server.runtime.kv_transfer import first_token_pending, first_token_within
from decode_server.runtime.lora import Models
from decode_server.runtime.metrics import Metrics
from decode_server.runtime.request_record import RequestRecord, RequestStats


def wire_request_id(caller_id: str) -> str:
    return f"generate-tokens-{caller_id}"


class Generation:
    """An admitted request whose engine request has not started yet: a batch body to await, or a
    stream's framed events (one block per write)."""

    def __init__(self, request_id: str, stats: RequestStats, *, body: Callable[[], Awaitable[Any]] | None = None,
                 events: AsyncIterator[bytes] | None = None, one_pass: bool = False):
        self.request_id = request_id  # the caller's
        self.stats = stats
        self.stream = events is not None
        # Its head may be awaited inside the response, cancelled there if its client leaves: a
        # one-pass stream aborts its engine request under a shield, and holds no remote KV to release.
        self.head_in_response = one_pass
        self._body = body
        self._events = events

    async def head(self) -> Any:
        """What answers first: the batch body, or a stream's first events (None: none at all)."""
        if self._events is None:
            return await self._body()
        return await anext(self._events, None)

    def rest(self) -> AsyncIterator[bytes]:
        """A stream's events after its head."""
        assert self._events is not None, "a batch request has one body; a stream's rest comes after its head"
        return self._events


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
        # Streams are read once per engine step by one consumer where the engine client allows it.
        self._one_pass = config.one_pass_streams and step_collectors(engine.llm)
        self._consumer = StepConsumer(metrics)

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
        stats = RequestStats()
        logprobs = mode.logprobs(sp, self._logprob_tokenizer)
        kv = admitted.kv_transfer_params
        watch = self._remote_prefill_name(kv)
        aliases = (ctx.request_id,) if watch is None else (ctx.request_id, watch)
        request = self._engine_request(admitted, aliases, headers, trace_headers)
        if not stream:
            steps = token_steps(self._outputs(request, kv, watch), keep_text_only=mode.needs_text)
            if logprobs is not None:
                steps = each(steps, logprobs)
            if mode.batch_stage is not None:
                steps = mode.batch_stage(steps, admitted.plan)
            steps = counted(steps, stats, final_only=True)
            return Generation(req.request_id, stats, body=lambda: batch_response(ctx, steps, stats))
        stages = [] if logprobs is None else [logprobs]
        if mode.stream_stage is not None:
            stages.append(mode.stream_stage(admitted.plan, req.token_ids, sp))
        stages.append(StepCounter(stats, final_only=False))
        pipeline = StreamPipeline(mode.needs_text, stages, StreamWire(ctx, stats))
        if watch is None and self._one_pass:
            events = OnePassStream(self._consumer, self.engine, request, pipeline).events()
            return Generation(req.request_id, stats, events=events, one_pass=True)
        # a decode leg's first-token deadline wraps its outputs, or a vLLM without the collector
        events = framed_outputs(pipeline, self._outputs(request, kv, watch))
        return Generation(req.request_id, stats, events=events)

    def _outputs(self, request: EngineRequest, kv: dict[str, Any] | None, watch: str | None) -> AsyncIterator[RequestOutput]:
        """The engine's outputs through vLLM's `generate()`; a decode leg's first one within its
        deadline (504), or it ends clearly."""
        engine = self.engine
        outputs = engine.generate(request)
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
