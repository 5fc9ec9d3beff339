"""One generate request's bookkeeping, reported once however it ends: metrics and the access line.

`RequestRecord` is a context manager around the request, from its first byte to its last chunk:
the request is recorded when the `with` ends, with the status it ended with, and an error leaves
the block as the `ServerError` it was recorded as (the one the client is shown).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import TracebackType

from decode_server.errors import describe
from decode_server.runtime.access_log import log_request
from decode_server.runtime.metrics import HistogramTally, Metrics
from decode_server.runtime.tracing import RequestSpan

# How long a stream's inter-token samples may wait for /metrics while it writes (scrapes are 15-30 s apart).
ITL_FLUSH_S = 1.0


@dataclass(slots=True)
class RequestStats:
    """What metrics, the access line and usage learn from a request as it runs (the stats stage
    fills it, before the wire)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    choice_tokens: dict[int, int] = field(default_factory=dict)  # completion tokens per choice index
    first_token_at: float | None = None  # time.monotonic()
    finish_reasons: list[str] = field(default_factory=list)
    cached_tokens: int | None = None  # prefix-cache hits, as the engine reports them
    # Completion tokens whose events have been handed to the response (a stream's events are made
    # when their engine step comes, and written when its writer runs: ITL is measured at the write).
    sent_tokens: int = 0


class RequestRecord:
    def __init__(self, metrics: Metrics, access_log: bool = True, span: RequestSpan | None = None):
        self.metrics = metrics
        self.access_log = access_log
        self.span = span or RequestSpan({}, enabled=False)  # the server span (tracing.py)
        self.started = time.monotonic()
        self.request_id: str | None = None
        self.output_mode = "unknown"
        self._stats: RequestStats | None = None  # set once admitted: in flight until the end
        self._itl: HistogramTally | None = None
        self._itl_seen = 0
        self._itl_last = 0.0
        self._itl_flushed_at = 0.0

    def named(self, request_id: str, output_mode: str) -> None:
        """The request is decoded: what the access line and the metric labels call it."""
        self.request_id, self.output_mode = request_id, output_mode

    def in_flight(self, stats: RequestStats) -> None:
        """The request is valid and its engine generator exists: it is in flight until the end."""
        self._stats = stats
        # A stream samples the inter-token histogram at every write: into a tally, added to the
        # histogram at the first write a second (ITL_FLUSH_S) after the last, and when the request ends.
        self._itl = HistogramTally(self.metrics.itl.labels(self.output_mode))
        self.metrics.in_flight.labels(self.output_mode).inc()
        self.metrics.server_load += 1

    def chunk_sent(self) -> None:
        """A stream write is on its way: one inter-token sample per token after the first, so the
        count does not depend on how many steps a lagging writer sends in one write. A write's
        tokens share its gap; those that come with the first token share none (its wait is TTFT)."""
        tokens = self._stats.sent_tokens
        new = tokens - self._itl_seen
        if new > 0:
            now = time.monotonic()
            gap, samples = ((now - self._itl_last) / new, new) if self._itl_seen else (0.0, new - 1)
            if samples:
                self._itl.observe(gap, samples)
            self._itl_seen, self._itl_last = tokens, now
            if now - self._itl_flushed_at >= ITL_FLUSH_S:
                self._itl.flush()
                self._itl_flushed_at = now

    def __enter__(self) -> RequestRecord:
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if e is None:
            self._finish(200, None)
            return
        if not isinstance(e, Exception):  # cancelled, or the stream closed: its client went away
            self._finish(499, None)
            return
        error = describe(e)
        self._finish(error.status, error.reason)
        if error is not e:
            raise error from e

    def _finish(self, status: int, reason: str | None) -> None:
        m = self.metrics
        m.requests.labels(self.output_mode, str(status)).inc()
        if reason is not None:
            m.rejections.labels(reason).inc()
        if status == 499:
            m.aborted("client_disconnect")
        stats = self._stats
        ttft_s = None if stats is None or stats.first_token_at is None else stats.first_token_at - self.started
        if stats is not None:
            self._itl.flush()
            m.in_flight.labels(self.output_mode).dec()
            m.server_load -= 1
            if ttft_s is not None:
                m.ttft.labels(self.output_mode).observe(ttft_s)
            if "abort" in stats.finish_reasons:
                m.aborted("engine_abort")
        self.span.end(
            {
                "decode_server.output_mode": self.output_mode,
                "http.response.status_code": status,
                "gen_ai.request.id": self.request_id or "",
                "gen_ai.usage.input_tokens": stats.prompt_tokens if stats else 0,
                "gen_ai.usage.output_tokens": stats.completion_tokens if stats else 0,
            },
            status,
        )
        if not self.access_log:
            return
        log_request(
            request_id=self.request_id,
            output_mode=self.output_mode,
            status=status,
            prompt_tokens=stats.prompt_tokens if stats else 0,
            output_tokens=stats.completion_tokens if stats else 0,
            ttft_s=ttft_s,
            duration_s=time.monotonic() - self.started,
        )
