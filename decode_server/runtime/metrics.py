"""Prometheus series: vLLM's own `vllm:` stats (its stat loggers) plus ours under `decode_server_`.

Every `decode_server_` series carries `model_name`, the served model name, exactly as vLLM's
series carry it (vLLM labels by the served model name even for a LoRA adapter's requests), so
ours join vLLM's `on (model_name)`.

With --api-server-count N, PROMETHEUS_MULTIPROC_DIR is set (as vLLM's own multi-API-server mode
sets it) and every process writes its series there; /metrics merges them all, as vLLM's does.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5, 10, 20, 40)
MODEL_LABEL = "model_name"
REMOTE_PREFILL_OUTCOMES = ("ok", "timeout", "failed")


class _ModelBound:
    """A metric with its first label, model_name, fixed: `labels(...)` takes the others."""

    def __init__(self, metric: Any, model_name: str):
        self._metric, self._model_name = metric, model_name

    def labels(self, *values: str) -> Any:
        return self._metric.labels(self._model_name, *values)


class HistogramTally:
    """Samples of one labelled histogram child, counted here and added to the child in one go
    (`flush`). prometheus_client's `observe` takes two locks per sample (the sum and the bucket);
    per streamed token that was ~4 % of a tokens stream's frontend CPU (bench/profile.py). The
    child's buckets are its own value objects, so a flushed tally is what the same samples
    observed one by one would show, with multiprocess files too (tests/app/runtime/
    test_histogram_tally.py holds prometheus_client to that)."""

    __slots__ = ("_child", "_bounds", "_counts", "_sum")

    def __init__(self, child: Any):
        self._child = child
        self._bounds = child._upper_bounds  # ascending, +Inf last: every sample has a bucket
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    def observe(self, value: float, samples: int = 1) -> None:
        # observe() puts a sample in the first bucket whose bound is >= it: bisect_left finds that one.
        self._counts[bisect.bisect_left(self._bounds, value)] += samples
        self._sum += value * samples

    def flush(self) -> None:
        counts = self._counts
        for i, n in enumerate(counts):
            if n:
                self._child._buckets[i].inc(n)
                counts[i] = 0
        if self._sum:
            self._child._sum.inc(self._sum)
            self._sum = 0.0


class Metrics:
    def __init__(self, model_name: str, draining: Callable[[], bool] = lambda: False) -> None:
        """`model_name`: the served model name (vLLM's `model_config.served_model_name`);
        `draining`: whether the process drains (sampled for decode_server_draining)."""
        self.multiprocess = "PROMETHEUS_MULTIPROC_DIR" in os.environ
        self.registry = CollectorRegistry(auto_describe=True)
        self._draining = draining
        r = self.registry

        def labelled(cls: Any, name: str, doc: str, labels: list[str], **kw: Any) -> _ModelBound:
            return _ModelBound(cls(name, doc, [MODEL_LABEL, *labels], registry=r, **kw), model_name)

        def single(cls: Any, name: str, doc: str, **kw: Any) -> Any:
            return cls(name, doc, [MODEL_LABEL], registry=r, **kw).labels(model_name)

        self.requests = labelled(Counter, "decode_server_requests", "Generate requests by output mode and status code", ["output_mode", "status"])
        self.ttft = labelled(
            Histogram, "decode_server_time_to_first_token_seconds", "Time to first token", ["output_mode"], buckets=_LATENCY_BUCKETS
        )
        self.itl = labelled(
            Histogram,
            "decode_server_inter_token_latency_seconds",
            "Gap between a stream's writes divided by the write's tokens (one sample per token after the first)",
            ["output_mode"],
            buckets=_LATENCY_BUCKETS,
        )
        self.in_flight = labelled(
            Gauge, "decode_server_requests_in_flight", "Admitted requests not yet answered (streams and batch)", ["output_mode"],
            multiprocess_mode="livesum",
        )
        self.aborts = labelled(Counter, "decode_server_aborts", "Aborted requests by cause", ["cause"])
        self.rejections = labelled(Counter, "decode_server_rejections", "4xx/5xx answers by reason", ["reason"])
        self.unknown_fields = labelled(
            Counter, "decode_server_ignored_fields", "Request fields this server does not know, ignored as vLLM does", ["field"]
        )
        self.remote_prefill = labelled(
            Counter,
            "decode_server_remote_prefill",
            "Decode legs (P/D, KV pulled from a prefill instance) by how their KV arrived: ok (a first "
            "token), timeout (504: none within DECODE_SERVER_REMOTE_PREFILL_TIMEOUT_S), failed (502: "
            "vLLM failed the KV load)",
            ["outcome"],
        )
        for outcome in REMOTE_PREFILL_OUTCOMES:  # at 0 from the start: a rule's ratio has its denominator
            self.remote_prefill.labels(outcome)
        self._stream_series(single)
        self._process_series(single)

    def _stream_series(self, single: Callable[..., Any]) -> None:
        """How streams are served (issue #30; the bench records them): the consumer's passes (one
        per engine step with stream outputs), the writers it woke, and the writes of every stream
        (÷ the tokens streamed: writes per token)."""
        self.stream_passes = single(
            Counter, "decode_server_stream_passes", "Passes of the one-pass stream consumer (one per engine step with stream outputs)"
        )
        self.stream_wakeups = single(
            Counter, "decode_server_stream_wakeups", "Stream writers woken by the one-pass consumer (one per stream that got events in a pass)"
        )
        self.stream_writes = single(Counter, "decode_server_stream_writes", "Writes of stream events to the response (one per wake-up; added when each stream ends)")

    def _process_series(self, single: Callable[..., Any]) -> None:
        """This process's own state: CPU, the drain, peers' aborts, per-request state held."""
        self._cpu = single(
            Gauge, "decode_server_frontend_cpu_seconds", "CPU seconds used by this (API server) process",
            multiprocess_mode="liveall",  # one series per API process (label pid)
        )
        if not self.multiprocess:
            self._cpu.set_function(time.process_time)
        self._draining_gauge = single(
            Gauge, "decode_server_draining", "1 from SIGTERM (the drain) until the process exits, else 0",
            multiprocess_mode="livemax",
        )
        # Engine requests a peer API process aborted for an abort this process received.
        self.peer_aborts = (
            single(Counter, "decode_server_peer_aborts", "Engine requests a peer API process aborted for this one")
            if self.multiprocess
            else None
        )
        # Requests admitted and not yet answered (GET /load, as vLLM's server_load_metrics).
        self.server_load = 0
        self._live = single(
            Gauge, "decode_server_live_request_states", "Requests the server holds per-request state for",
            multiprocess_mode="livesum",
        )

    def aborted(self, cause: str, count: int = 1) -> None:
        self.aborts.labels(cause).inc(count)

    def refresh(self, engine: Any) -> None:
        """Set this process's sampled gauges (a peer asks before it renders the merged page)."""
        self._live.set(engine.live_request_count())
        self._draining_gauge.set(1 if self._draining() else 0)
        if self.multiprocess:
            self._cpu.set(time.process_time())

    def render(self, engine: Any) -> tuple[bytes, str]:
        self.refresh(engine)
        if self.multiprocess:
            from vllm.v1.metrics.prometheus import get_prometheus_registry  # every process's files merged

            return prometheus_client.generate_latest(get_prometheus_registry()), prometheus_client.CONTENT_TYPE_LATEST
        body = prometheus_client.generate_latest(prometheus_client.REGISTRY) + prometheus_client.generate_latest(self.registry)
        return body, prometheus_client.CONTENT_TYPE_LATEST
