"""The server span per generate request (OpenTelemetry), in process, with the SDK's in-memory
exporter: parented by the caller's `traceparent`, carrying mode, status and token counts, and
passed on to vLLM's engine tracing (the engine request's trace headers name the server span)."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from decode_server.runtime.tracing import SPAN_NAME
from tests.support.inprocess import body_for, error_of, serve
from tests.support.servers import PARSER_FLAGS
from tests.support import GENERATE

pytestmark = pytest.mark.anyio

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
# vLLM exports its own spans to this endpoint; nothing listens there, and these tests read ours.
TRACING = ["--otlp-traces-endpoint", "http://127.0.0.1:1"]


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """The process's tracer provider (set once; vLLM's own init then leaves it as it is)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider, "another tracer provider was set first in this process"
    return exporter


def spans(exporter: InMemorySpanExporter, request_id: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == SPAN_NAME and s.attributes["gen_ai.request.id"] == request_id]


async def test_a_server_span_per_request_under_the_callers_traceparent(demo_model, exporter):
    async with serve(demo_model, *PARSER_FLAGS, *TRACING) as s:
        headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
        r = await s.client.post(GENERATE, json=body_for("text", [9707, 11, 1879], request_id="traced"), headers=headers)
        assert r.status_code == 200, r.text
        events = await s.events(body_for("tokens", [9707, 11], request_id="streamed"), headers=headers)
        assert events[-1] == "[DONE]"
        bad = await s.client.post(GENERATE, json=body_for("tokens", [9707], request_id="refused", model="nope"), headers=headers)
        assert error_of(bad)[:2] == (404, "The model `nope` does not exist."), bad.text
        seen = {req.request_id.split("-")[2]: req for req in s.core.seen}

    (span,) = spans(exporter, "traced")
    ctx = span.get_span_context()
    assert f"{ctx.trace_id:032x}" == TRACE_ID and f"{span.parent.span_id:016x}" == CALLER_SPAN and span.parent.is_remote
    assert span.kind == trace.SpanKind.SERVER
    assert dict(span.attributes) == {
        "decode_server.output_mode": "text", "http.response.status_code": 200, "gen_ai.request.id": "traced",
        "gen_ai.usage.input_tokens": 2, "gen_ai.usage.output_tokens": 4,  # 3 scripted + EOS
    }
    # vLLM's engine request is the server span's child: its traceparent names the server span.
    engine_headers = seen["traced"].trace_headers
    assert engine_headers["traceparent"] == f"00-{TRACE_ID}-{ctx.span_id:016x}-01", engine_headers
    assert engine_headers["tracestate"] == "vendor=1"

    (streamed,) = spans(exporter, "streamed")
    assert streamed.attributes["decode_server.output_mode"] == "tokens" and streamed.attributes["gen_ai.usage.output_tokens"] == 3
    assert streamed.end_time >= streamed.start_time
    (refused,) = spans(exporter, "refused")
    assert refused.attributes["http.response.status_code"] == 404 and refused.attributes["gen_ai.usage.output_tokens"] == 0


async def test_no_span_without_engine_tracing(demo_model, exporter):
    async with serve(demo_model, *PARSER_FLAGS) as s:
        r = await s.client.post(GENERATE, json=body_for("tokens", [9707], request_id="untraced"), headers={"traceparent": TRACEPARENT})
        assert r.status_code == 200, r.text
        (req,) = s.core.seen
    assert spans(exporter, "untraced") == []
    assert req.trace_headers is None  # vLLM drops a request's trace context while its tracing is off
