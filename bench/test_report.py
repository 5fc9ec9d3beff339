"""Unit checks of the benchmark report, no engine: records aggregated into the headline tables, issue
#16's and issue #30's sections (`python -m pytest bench/test_report.py`; the app tier runs them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.report import aggregate, write_report
from bench.scenarios import Scenario


# ------------------------------------------------------------------ headline aggregation and report


def _record(
    system: str, level: str, rep: int, cpu: float, ttft: float = 10.0, batch: bool = False, *, length: int = 512, c: int = 8,
    n: int = 16, prompt_len: int = 0, tok_s: float | None = None, ttft_p90: float | None = None,
) -> dict:  # fmt: skip
    sc = Scenario(system, level, length, c, n, batch, rep, prompt_len)
    d = {"p50": ttft, "p90": ttft, "p99": ttft, "mean": ttft, "n": n}
    summary = {"requests": n, "completed": n, "errors": 0, "truncated": False, "output_tok_s": tok_s or 1000.0 + rep,
               "output_tokens": length * n, "ttft_ms": {**d, "p90": ttft_p90 or ttft}, "tpot_ms": d, "tpot_req_ms": d, "e2e_ms": d,
               "tokens_per_event": 1.0}  # fmt: skip
    return {"id": sc.id, "system": system, "level": level, "length": length, "concurrency": c, "requests": n, "batch": batch,
            "rep": rep, "prompt_len": prompt_len, "cell": sc.cell, "summary": summary, "cpu": {"foreign_cores": 0.1},
            "frontend_cpu_ms_per_token": cpu, "exact_length": True}  # fmt: skip


_META = {"mode": "headline", "started": "now", "repeat": 5, "machine": {"cpus": 2, "cpu_model": "x", "mem_gib": 23.5, "python": "3",
         "vllm": "0.32"}, "engine_flags": [], "tool_flags": [], "bind": "auto", "prompt_tokens": 262, "loadavg_start": [0, 0, 0]}  # fmt: skip


def _report(out: Path, recs: list[dict]) -> str:
    """results.md as `python -m bench.report OUT` renders it from OUT/results.json."""
    (out / "results.json").write_text(json.dumps({"meta": _META, "scenarios": recs}))
    write_report(out)
    return (out / "results.md").read_text()


def test_headline_aggregate_and_report(tmp_path: Path) -> None:
    recs = []
    for rep in range(5):
        recs += [_record("inproc", "tokens", rep, 0.05), _record("ours", "tokens", rep, 0.15 + 0.01 * rep), _record("vllm", "tokens", rep, 0.25)]
    recs.append({**_record("ours", "text", 0, 0.2), "exact_length": False})  # an invalid run is left out
    rows = aggregate(recs)
    assert [r["label"] for r in rows] == ["stream c8: tokens vs tokens", "stream c8: text vs text"]
    row = rows[0]
    assert row["systems"]["ours"]["cpu_ms_per_token"]["median"] == pytest.approx(0.17)
    assert row["cpu_ratio"]["n"] == 5 and row["cpu_ratio"]["median"] == pytest.approx(0.68)
    assert row["overhead_ms_per_token"]["ours"]["median"] == pytest.approx(0.12)
    assert row["overhead_ms_per_token"]["vllm"]["median"] == pytest.approx(0.20)
    assert row["overhead_ratio"]["min"] == pytest.approx(0.5) and row["overhead_ratio"]["max"] == pytest.approx(0.7)
    assert rows[1]["systems"]["ours"]["cpu_ms_per_token"]["n"] == 0
    md = _report(tmp_path, recs)
    assert "0.680 [" in md and "headline run (5 interleaved repetitions)" in md
    assert "## TTFT" not in md and "Target: SSE throughput" not in md
    runs = md.split("## All runs")[1]
    assert runs.count("| ours | tokens, rep ") == 5 and "| ours | text, rep 0 ⚠ lengths |" in runs


def test_headline_issue_16_report(tmp_path: Path) -> None:
    """64 streams: ours ÷ floor and vLLM ÷ floor tok/s per repetition and the target line; TTFT cells: their table."""
    recs = []
    for rep in range(5):
        floor = 1600.0 + 10 * rep
        recs += [
            _record("inproc", "tokens", rep, 0.05, length=256, c=64, n=64, tok_s=floor),
            _record("ours", "tokens", rep, 0.10, length=256, c=64, n=64, tok_s=floor * (0.95 + 0.01 * rep)),  # 0.95..0.99
            _record("vllm", "tokens", rep, 0.12, length=256, c=64, n=64, tok_s=floor * 0.90),
        ]
        for c, n, p, base in ((32, 256, 256, 20.0), (4, 8, 8000, 400.0)):
            recs += [
                _record("inproc", "tokens", rep, 0.3, base * 0.9, length=8, c=c, n=n, prompt_len=p, ttft_p90=base),
                _record("ours", "tokens", rep, 0.4, base * (1 + 0.01 * rep), length=8, c=c, n=n, prompt_len=p, ttft_p90=base * 1.6),
                _record("vllm", "tokens", rep, 0.5, base * 1.25, length=8, c=c, n=n, prompt_len=p, ttft_p90=base * 2.0),
            ]
    rows = aggregate(recs)
    assert [r["label"] for r in rows] == [
        "stream c64: tokens vs tokens",
        "stream c32, 256-token prompts, L8: tokens vs tokens",
        "stream c4, 8000-token prompts, L8: tokens vs tokens",
    ]
    c64, ttft8k = rows[0], rows[2]
    assert c64["tok_s_vs_floor"]["ours"]["median"] == pytest.approx(0.97)
    assert (c64["tok_s_vs_floor"]["ours"]["min"], c64["tok_s_vs_floor"]["ours"]["max"]) == (pytest.approx(0.95), pytest.approx(0.99))
    assert c64["tok_s_vs_floor"]["vllm"]["median"] == pytest.approx(0.90) and c64["tok_s_vs_floor"]["ours"]["n"] == 5
    assert ttft8k["ttft_ratio"]["median"] == pytest.approx(1.02 / 1.25) and ttft8k["ttft_p90_ratio"]["median"] == pytest.approx(0.8)
    assert ttft8k["systems"]["floor"]["ttft_p50_ms"]["median"] == pytest.approx(360.0)
    md = _report(tmp_path, recs)
    ratios = md.split("## Headline ratios")[1].split("## TTFT")[0]
    assert "| stream c64: tokens vs tokens |" in ratios and "prompts" not in ratios.split("|---|")[1]  # TTFT cells: not here
    assert "0.970 [0.950–0.990] | 0.900 [0.900–0.900] |" in ratios  # tok/s ours ÷ floor, vLLM ÷ floor columns
    assert "**Target: SSE throughput at 64 streams ≥ 0.97× the in-process engine**" in ratios
    assert "**ours ÷ floor 0.970 [0.950–0.990]**, vLLM ÷ floor 0.900 [0.900–0.900]" in ratios and "met (median)" in ratios
    ttft = md.split("## TTFT")[1].split("## Per system")[0]
    assert "| stream c4, 8000-token prompts, L8: tokens vs tokens | 8 | 0.816 [0.800–0.832] | 0.800 [0.800–0.800] | 408.0 [400.0–416.0] | 500.0 [500.0–500.0] | 360.0 [360.0–360.0] |" in ttft
    assert "| stream c32, 256-token prompts, L8: tokens vs tokens | 256 |" in ttft
    assert "8000-token prompts" in md.split("## Per system")[1]


def test_targets_latency_and_counters_report(tmp_path: Path) -> None:
    """Issue #30: each target met or missed by how much; events/token, gaps, TTFT p99, both floors
    and ours' stream counters side by side."""
    recs = []
    for rep in range(5):
        gap = lambda p50, p99: {"p50": p50, "p90": p99, "p99": p99, "mean": p50, "n": 10}  # noqa: E731
        ours, vllm = _record("ours", "tokens", rep, 0.14), _record("vllm", "tokens", rep, 0.2)
        ours["summary"] |= {"events_per_token": 1.0, "event_gap_ms": gap(20.0, 30.0)}
        vllm["summary"] |= {"events_per_token": 1.03, "event_gap_ms": gap(21.0, 29.0)}
        ours["server_counters"] = {"wakeups_per_step": 7.5, "writes_per_token": 0.998}
        recs += [_record("inproc", "tokens", rep, 0.05), _record("inproc", "nodetok", rep, 0.04), ours, vllm]
    row = aggregate(recs)[0]
    assert row["overhead_nodetok_ratio"]["median"] == pytest.approx(0.1 / 0.16)
    md = _report(tmp_path, recs)
    targets = md.split("## Issue #30's targets")[1].split("## Latency")[0]
    assert "CPU/token ÷ vLLM 0.700 ≤ 0.75: met" in targets
    assert "overhead ÷ vLLM's 0.600 ≤ 0.5: missed by 0.100" in targets
    assert "events/token within ±0.02 of vLLM's: missed by 0.010" in targets
    assert "gap p99 ≤ vLLM's: missed by 1.000" in targets and "TTFT p50 ≤ vLLM's: met" in targets
    latency = md.split("## Latency")[1].split("## Per system")[0]
    assert "| stream c8: tokens vs tokens | 1.000 / 1.030 | 20.00 / 21.00 | 30.00 / 29.00 |" in latency
    assert "| 0.0500 / 0.0400 | 7.50 | 0.998 |" in latency
