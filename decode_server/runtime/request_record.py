"""One generate request's bookkeeping, reported once however it ends: metrics and the access line."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from decode_server.runtime.access_log import log_request
from decode_server.errors import describe
from decode_server.runtime.metrics import Metrics


class RequestRecord:
    def __init__(self, metrics: Metrics, access_log: bool = True):
        self.metrics = metrics
        self.access_log = access_log
        self.started = time.monotonic()
        self.request_id: str | None = None
        self.output_mode = "unknown"
        self._generation: Any = None
        self._finished = False

    def admitted(self, request_id: str, output_mode: str, generation: Any) -> None:
        """The request is valid and its engine generator exists: it is in flight until `finish`."""
        self.request_id, self.output_mode, self._generation = request_id, output_mode, generation
        self.metrics.in_flight.labels(output_mode).inc()
        self.metrics.server_load += 1

    def finish(self, status: int, reason: str | None = None) -> None:
        if self._finished:
            return
        self._finished = True
        m = self.metrics
        m.requests.labels(self.output_mode, str(status)).inc()
        if reason is not None:
            m.rejections.labels(reason).inc()
        if status == 499:
            m.aborted("client_disconnect")
        stats = self._generation.stats if self._generation is not None else None
        ttft_s = None if stats is None or stats.first_token_at is None else stats.first_token_at - self.started
        if self._generation is not None:
            m.in_flight.labels(self.output_mode).dec()
            m.server_load -= 1
            if ttft_s is not None:
                m.ttft.labels(self.output_mode).observe(ttft_s)
            if "abort" in stats.finish_reasons:
                m.aborted("engine_abort")
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

    async def track(self, chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """Pass a stream's chunks through, one inter-token sample per chunk; finish however it ends."""
        stats = self._generation.stats
        itl = self.metrics.itl.labels(self.output_mode)
        last = time.monotonic()
        seen = stats.completion_tokens
        status, reason = 200, None
        try:
            async for chunk in chunks:
                new = stats.completion_tokens - seen
                if new > 0:
                    now = time.monotonic()
                    if seen:
                        itl.observe((now - last) / new)
                    seen, last = stats.completion_tokens, now
                yield chunk
        except (asyncio.CancelledError, GeneratorExit):
            status = 499
            raise
        except Exception as e:
            error = describe(e)
            status, reason = error.status, error.reason
            raise
        finally:
            self.finish(status, reason)
