"""The stats stage, last before the wire: counts what each step carries into the request's
`RequestStats` (read by the wire for usage, and by the request record for metrics and the access
line). It changes no step."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from decode_server.generate.pipeline.steps import Step, each
from decode_server.runtime.request_record import RequestStats


def counted(steps: AsyncIterator[Step], stats: RequestStats, *, final_only: bool) -> AsyncIterator[Step]:
    """`StepCounter` over an async source (the batch path)."""
    return each(steps, StepCounter(stats, final_only=final_only))


class StepCounter:
    """`final_only`: the engine sends one output at the end (batch), so the first token's time is
    the engine's own record of it; a stream's is when its step arrives."""

    __slots__ = ("stats", "final_only", "_first")

    def __init__(self, stats: RequestStats, *, final_only: bool):
        self.stats, self.final_only, self._first = stats, final_only, True

    def __call__(self, step: Step) -> None:
        stats = self.stats
        if self._first:
            self._first = False
            stats.prompt_tokens = len(step.output.prompt_token_ids or ())
            stats.cached_tokens = step.output.num_cached_tokens
        for c in step.choices:
            stats.choice_tokens[c.index] = stats.choice_tokens.get(c.index, 0) + c.num_tokens
            stats.completion_tokens += c.num_tokens
            if stats.first_token_at is None and c.num_tokens:
                stats.first_token_at = _engine_first_token_at(step.output) if self.final_only else time.monotonic()
            if c.finish_reason is not None:
                stats.finish_reasons.append(c.finish_reason)


def _engine_first_token_at(out: Any) -> float:
    """When the first token came, on the monotonic clock: the engine's own record where it keeps
    one (a FINAL_ONLY request reaches us only at the end), else now."""
    now = time.monotonic()
    metrics = getattr(out, "metrics", None)
    latency = getattr(metrics, "first_token_latency", 0.0)
    arrival = getattr(metrics, "arrival_time", 0.0)
    if not latency or not arrival:
        return now
    return now - max(0.0, time.time() - (arrival + latency))
