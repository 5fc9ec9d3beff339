"""Statistics for the benchmarks: percentiles, per-run summaries of a LoadResult, and spreads over repetitions.

Per run (`summarize`, `summarize_load`), from the arrival times the load generator
(bench.loadgen) or the in-process driver (bench.inproc) recorded:

- TTFT: request sent -> first event carrying >= 1 output token (batch: the whole response);
- TPOT per token (inter-token latency): for each later token-carrying event, (gap since the
  previous token-carrying event) / (tokens in the event), counted once per token, pooled over
  all streams, so p50/p90/p99 are over tokens, not requests;
- TPOT per request: (last token time - first token time) / (tokens after the first event);
- E2E: request sent -> response fully read;
- output tokens/s: all output tokens / wall time of the run.

Over repetitions (`spread`, `paired`): median, min, max and the interquartile range of
one metric across the repetitions of a scenario, and of a per-repetition ratio or
difference between two systems measured in the same repetition.

The results are read through the two Protocols below (bench.loadgen's StreamResult and
LoadResult satisfy them), so this module imports nothing from bench.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol


class StreamResult(Protocol):
    """One request's arrival record (bench.loadgen.StreamResult)."""

    start: float
    end: float | None
    times: list[float]
    ntoks: list[int]
    error: str | None
    finish_reason: str | None

    @property
    def tokens(self) -> int: ...

    @property
    def completed(self) -> bool: ...


class LoadResult(Protocol):
    """One run (bench.loadgen.LoadResult)."""

    started: float
    truncated: bool
    concurrency: int

    @property
    def results(self) -> Sequence[StreamResult]: ...

    @property
    def wall_s(self) -> float: ...


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of already sorted values."""
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def dist_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99/mean (milliseconds) and n of values given in seconds."""
    v = sorted(x * 1000.0 for x in values_s)
    return {
        "p50": _r(percentile(v, 50)),
        "p90": _r(percentile(v, 90)),
        "p99": _r(percentile(v, 99)),
        "mean": _r(sum(v) / len(v)) if v else None,
        "n": len(v),
    }


def _count(items: Iterable[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[str(x)] = out.get(str(x), 0) + 1
    return out


GAP_QUANTILES = tuple(range(0, 101, 5))  # the inter-event gap distribution a results.json keeps (bench/figure.py)


def gap_quantiles_ms(values_s: Sequence[float]) -> list[float | None]:
    """The values (seconds) at each of GAP_QUANTILES, in milliseconds: a distribution small enough to keep."""
    v = sorted(x * 1000.0 for x in values_s)
    return [_r(percentile(v, q)) for q in GAP_QUANTILES]


def _latencies(results: Sequence[StreamResult]) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    """(ttft, e2e, tpot per request, tpot per token, gap between token-carrying events) in seconds."""
    ttft: list[float] = []
    e2e: list[float] = []
    tpot_req: list[float] = []
    per_token: list[float] = []
    event_gaps: list[float] = []
    for r in results:
        if r.times:
            ttft.append(r.times[0] - r.start)
            for i in range(1, len(r.times)):
                event_gaps.append(r.times[i] - r.times[i - 1])
                gap = event_gaps[-1] / r.ntoks[i]
                per_token.extend([gap] * r.ntoks[i])
            after_first = r.tokens - r.ntoks[0]
            if after_first > 0 and r.completed:
                tpot_req.append((r.times[-1] - r.times[0]) / after_first)
        if r.completed:
            e2e.append(r.end - r.start)
    return ttft, e2e, tpot_req, per_token, event_gaps


def summarize(results: Sequence[StreamResult], wall_s: float) -> dict[str, Any]:
    """Latency/throughput summary of a set of stream results."""
    ttft, e2e, tpot_req, per_token, event_gaps = _latencies(results)
    tokens = sum(r.tokens for r in results)
    events = sum(len(r.ntoks) for r in results)
    errors = [r.error for r in results if r.error]
    return {
        "requests": len(results),
        "completed": sum(r.completed for r in results),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "output_tokens": tokens,
        "token_events": events,
        "tokens_per_event": round(tokens / events, 3) if events else None,
        # A server that merges engine steps sends fewer events than tokens (vLLM's sends one per step).
        "events_per_token": round(events / tokens, 3) if tokens else None,
        "wall_s": round(wall_s, 3),
        "output_tok_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "ttft_ms": dist_ms(ttft),
        "tpot_ms": dist_ms(per_token),
        "tpot_req_ms": dist_ms(tpot_req),
        # What a client sees between two events that carry tokens, whatever they carry.
        "event_gap_ms": dist_ms(event_gaps),
        "event_gap_quantiles_ms": gap_quantiles_ms(event_gaps),
        "e2e_ms": dist_ms(e2e),
        "finish_reasons": _count(r.finish_reason for r in results),
    }


def summarize_load(load: LoadResult) -> dict[str, Any]:
    """The summary of one run, with whether it was cut off by its time limit."""
    return {**summarize(load.results, load.wall_s), "truncated": load.truncated, "concurrency": load.concurrency}


# ------------------------------------------------------------------ over repetitions


def spread(values: Iterable[float | None], nd: int = 4) -> dict[str, Any]:
    """Median, min, max, quartiles and n of the non-missing values (None fields when there are none)."""
    v = sorted(float(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x)))
    if not v:
        return {"median": None, "min": None, "max": None, "q1": None, "q3": None, "iqr": None, "n": 0}
    q1, q3 = percentile(v, 25), percentile(v, 75)
    return {
        "median": _r(percentile(v, 50), nd),
        "min": _r(v[0], nd),
        "max": _r(v[-1], nd),
        "q1": _r(q1, nd),
        "q3": _r(q3, nd),
        "iqr": _r(q3 - q1, nd),
        "n": len(v),
    }


def paired(
    a: dict[int, float | None], b: dict[int, float | None], op: Callable[[float, float], float | None]
) -> dict[int, float | None]:
    """op(a[rep], b[rep]) for every repetition present in both (None where either is missing)."""
    out: dict[int, float | None] = {}
    for rep in sorted(set(a) & set(b)):
        x, y = a[rep], b[rep]
        out[rep] = None if x is None or y is None else op(x, y)
    return out


def ratio(x: float, y: float) -> float | None:
    return None if y == 0 else x / y


def difference(x: float, y: float) -> float:
    return x - y
