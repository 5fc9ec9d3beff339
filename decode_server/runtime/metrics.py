"""Prometheus series: vLLM's own `vllm:` stats (its stat loggers) plus ours under `decode_server_`.

With --api-server-count N, PROMETHEUS_MULTIPROC_DIR is set (as vLLM's own multi-API-server mode
sets it) and every process writes its series there; /metrics merges them all, as vLLM's does.
"""

from __future__ import annotations

import os
import time
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5, 10, 20, 40)


class Metrics:
    def __init__(self) -> None:
        self.multiprocess = "PROMETHEUS_MULTIPROC_DIR" in os.environ
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
        self.in_flight = Gauge(
            "decode_server_requests_in_flight", "Admitted requests not yet answered (streams and batch)", ["output_mode"], registry=r,
            multiprocess_mode="livesum",
        )
        self.aborts = Counter("decode_server_aborts", "Aborted requests by cause", ["cause"], registry=r)
        self.rejections = Counter("decode_server_rejections", "4xx/5xx answers by reason", ["reason"], registry=r)
        self.unknown_fields = Counter(
            "decode_server_ignored_fields", "Request fields this server does not know, ignored as vLLM does", ["field"], registry=r
        )
        self._cpu = Gauge(
            "decode_server_frontend_cpu_seconds", "CPU seconds used by this (API server) process", registry=r,
            multiprocess_mode="liveall",  # one series per API process (label pid)
        )
        if not self.multiprocess:
            self._cpu.set_function(time.process_time)
        # Engine requests a peer API process aborted for an abort this process received.
        self.peer_aborts = (
            Counter("decode_server_peer_aborts", "Engine requests a peer API process aborted for this one", registry=r)
            if self.multiprocess
            else None
        )
        # Requests admitted and not yet answered (GET /load, as vLLM's server_load_metrics).
        self.server_load = 0
        self._live = Gauge(
            "decode_server_live_request_states", "Requests the server holds per-request state for", registry=r,
            multiprocess_mode="livesum",
        )

    def aborted(self, cause: str, count: int = 1) -> None:
        self.aborts.labels(cause).inc(count)

    def refresh(self, engine: Any) -> None:
        """Set this process's sampled gauges (a peer asks before it renders the merged page)."""
        self._live.set(engine.live_request_count())
        if self.multiprocess:
            self._cpu.set(time.process_time())

    def render(self, engine: Any) -> tuple[bytes, str]:
        self.refresh(engine)
        if self.multiprocess:
            from vllm.v1.metrics.prometheus import get_prometheus_registry  # every process's files merged

            return prometheus_client.generate_latest(get_prometheus_registry()), prometheus_client.CONTENT_TYPE_LATEST
        body = prometheus_client.generate_latest(prometheus_client.REGISTRY) + prometheus_client.generate_latest(self.registry)
        return body, prometheus_client.CONTENT_TYPE_LATEST
