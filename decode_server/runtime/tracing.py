"""A server span per generate request (OpenTelemetry), when vLLM's engine tracing is on.

`--otlp-traces-endpoint` turns on vLLM's own tracing: its AsyncLLM sets the process's tracer
provider (an OTLP exporter to that endpoint) and records an `llm_request` span per engine request,
parented by the trace headers the request carries. The server span sits between the caller and
vLLM's: it is parented by the caller's `traceparent` (vLLM's own extraction), and the engine
request carries the server span's context instead of the caller's, so the trace reads
caller → decode-server → vLLM. The span ends with the request (streams: their last chunk), with
the output mode, the status and the token counts.

The OpenTelemetry packages are vLLM dependencies today; the `tracing` extra names them so an
install without them still serves (no spans; the caller's headers go to the engine as before).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `tracing` extra is not installed
    trace = None

from vllm.tracing.utils import contains_trace_headers, extract_trace_headers

SPAN_NAME = "decode_server.generate"
_TRACER_NAME = "decode_server"


def tracing_available() -> bool:
    return trace is not None


class RequestSpan:
    """One request's server span. With tracing off (or no OpenTelemetry) there is none: the engine
    gets the caller's trace headers, as vLLM's generate passes them."""

    def __init__(self, headers: Mapping[str, str], enabled: bool):
        self._caller = extract_trace_headers(headers) if contains_trace_headers(headers) else None
        self._span: Any = None
        if enabled and trace is not None:
            from vllm.tracing import extract_trace_context

            parent = extract_trace_context(self._caller)
            self._span = trace.get_tracer(_TRACER_NAME).start_span(SPAN_NAME, context=parent, kind=SpanKind.SERVER)

    def engine_trace_headers(self) -> Mapping[str, str] | None:
        """What the engine request carries: the server span's context, else the caller's headers."""
        if self._span is None:
            return self._caller
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier

    def end(self, attributes: Mapping[str, Any], status: int) -> None:
        if self._span is None:
            return
        self._span.set_attributes(dict(attributes))
        if status >= 500:
            self._span.set_status(Status(StatusCode.ERROR))
        self._span.end()
