"""bench.first_token's reading of a burst, without an engine: `python -m pytest bench/test_first_token.py`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.first_token import burst_times, in_window, read_traces, report, summary
from bench.loadgen import LoadResult, StreamResult


def _burst() -> dict:
    # Three streams sent at 10.000-10.002 s; the engine's first outputs put at 10.100-10.102 s, read
    # by their clients 5, 6 and 7 ms later; one full collection of 30 ms inside, one before.
    load = LoadResult([StreamResult(start=10.0 + i / 1000, times=[10.105 + i / 1000 * 2]) for i in range(3)],
                      started=10.0, finished=11.0, truncated=False, concurrency=3, requested=3)
    traces = [{"argv": ["x/decode_server/process/cli.py", "serve"], "full_gc": [[9.0, 0.4], [10.05, 0.03]],
               "first_put": {f"r{i}": 10.1 + i / 1000 for i in range(3)} | {"warm-up": 5.0}}]
    burst = {"system": "ours", "level": "tokens", "rep": 0, **burst_times(load)}
    burst.update(in_window(burst, traces))
    return burst


def test_a_bursts_delivery_is_the_median_read_after_the_median_put_and_its_collections_are_its_own() -> None:
    burst = _burst()
    assert burst["first_puts"] == pytest.approx([10.1, 10.101, 10.102]) and burst["full_gc_ms"] == pytest.approx([30.0])
    s = summary(burst)
    assert s["ttft_p50_ms"] == pytest.approx(106.0) and s["delivery_ms"] == pytest.approx(6.0)
    assert (s["full_gcs"], s["full_gc_ms"]) == (1, pytest.approx(30.0))


def test_a_burst_whose_puts_were_not_seen_has_no_delivery() -> None:
    burst = {**_burst(), "first_puts": [10.1]}
    assert summary(burst)["delivery_ms"] is None
    assert "| ours | tokens | 106.0 [106.0–106.0] | None [None–None] | 1 (30) |" in report([burst])


def test_only_api_processes_traces_are_read(tmp_path: Path) -> None:
    for pid, argv in ((1, ["x/decode_server/process/cli.py", "serve"]), (2, ["-c", ""]), (3, ["x/vllm/entrypoints/openai/api_server.py", "--model"])):
        (tmp_path / f"trace.{pid}.json").write_text(json.dumps({"argv": argv, "first_put": {}, "full_gc": []}))
    assert [t["argv"][0] for t in read_traces(tmp_path / "trace")] == ["x/decode_server/process/cli.py", "x/vllm/entrypoints/openai/api_server.py"]
