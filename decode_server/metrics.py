"""Prometheus series: vLLM's own `vllm:` stats (its stat loggers) plus ours under `decode_server_`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5, 10, 20, 40)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "decode_server_requests", "Generate requests by output mode and status code", ["output_mode", "status"], registry=r
        )
        self.ttft = Histogram(
            "decode_server_time_to_first_token_seconds", "Time to first token", ["output_mode"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "decode_server_inter_token_latency_seconds",
            "Gap between chunks of one stream divided by the chunk's tokens (one sample per chunk)",
            ["output_mode"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("decode_server_requests_in_flight", "Requests in flight", ["output_mode"], registry=r)
        self.aborts = Counter("decode_server_aborts", "Aborted requests by cause", ["cause"], registry=r)
        self.rejections = Counter("decode_server_rejections", "4xx/5xx answers by reason", ["reason"], registry=r)
        cpu = Gauge("decode_server_frontend_cpu_seconds", "CPU seconds used by this (API server) process", registry=r)
        cpu.set_function(time.process_time)
        self._live = Gauge("decode_server_live_request_states", "Requests the server holds per-request state for", registry=r)

    # ------------------------------------------------------------ events

    def rejected(self, output_mode: str, status: int, reason: str) -> None:
        self.requests.labels(output_mode, str(status)).inc()
        self.rejections.labels(reason).inc()

    def aborted(self, cause: str, count: int = 1) -> None:
        self.aborts.labels(cause).inc(count)

    def observe_start(self, output_mode: str, started: float, generation: Any) -> None:
        self.in_flight.labels(output_mode).inc()
        if generation.stats.first_token_at is not None:
            self.ttft.labels(output_mode).observe(generation.stats.first_token_at - started)

    def observe_finished(self, output_mode: str, started: float, generation: Any, status: int) -> None:
        self.requests.labels(output_mode, str(status)).inc()
        stats = generation.stats
        if stats.first_token_at is not None:
            self.ttft.labels(output_mode).observe(stats.first_token_at - started)
        if "abort" in stats.finish_reasons:
            self.aborted("engine_abort")

    async def track_stream(
        self, output_mode: str, started: float, generation: Any, chunks: AsyncIterator[Any], on_done: Any = None
    ) -> AsyncIterator[Any]:
        """Pass chunks through, timing them; in-flight is decremented however the stream ends."""
        stats = generation.stats
        itl = self.itl.labels(output_mode)
        last = time.monotonic()
        seen_tokens = stats.completion_tokens
        status = "200"
        try:
            async for chunk in chunks:
                now = time.monotonic()
                new_tokens = stats.completion_tokens - seen_tokens
                if new_tokens > 0:
                    if stats.first_token_at is not None and seen_tokens == 0:
                        self.ttft.labels(output_mode).observe(stats.first_token_at - started)
                    else:
                        # One observation per chunk (its per-token gap): the hot path stays
                        # O(1) per chunk whatever the stream interval.
                        itl.observe((now - last) / new_tokens)
                    seen_tokens = stats.completion_tokens
                    last = now
                yield chunk
        except (asyncio.CancelledError, GeneratorExit):
            status = "499"
            self.aborted("client_disconnect")
            raise
        except Exception:
            status = "500"
            raise
        finally:
            self.in_flight.labels(output_mode).dec()
            self.requests.labels(output_mode, status).inc()
            if "abort" in stats.finish_reasons:
                self.aborted("engine_abort")
            if on_done is not None:
                on_done(int(status))

    # ------------------------------------------------------------ exposition

    def render(self, engine: Any) -> tuple[bytes, str]:
        self._live.set(engine.live_request_count())
        body = prometheus_client.generate_latest(prometheus_client.REGISTRY) + prometheus_client.generate_latest(self.registry)
        return body, prometheus_client.CONTENT_TYPE_LATEST
