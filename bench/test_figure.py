"""bench/figure.py without an engine: `python -m pytest bench/test_figure.py` (needs the `bench`
extra's matplotlib; not under tests/, as bench/test_bench.py)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import stats
from bench.loadgen import StreamResult


def test_the_figure_shows_each_scenario_its_target_and_both_gap_curves(tmp_path: Path) -> None:
    from bench.figure import write_figure

    def run(system: str, level: str, rep: int, cpu: float, gaps_s: list[float]) -> dict:
        times = [0.1]
        for gap in gaps_s:
            times.append(times[-1] + gap)
        summary = stats.summarize([StreamResult(start=0.0, end=times[-1] + 0.01, times=times, ntoks=[1] * len(times))], wall_s=1.0)
        return {"system": system, "level": level, "rep": rep, "length": len(times), "concurrency": 8, "batch": False,
                "prompt_len": 0, "summary": summary, "frontend_cpu_ms_per_token": cpu, "cpu": {}}  # fmt: skip

    recs = [
        run(system, level, rep, cpu, gaps)
        for rep in (0, 1)
        for system, level, cpu, gaps in (
            ("ours", "derender", 0.06, [0.01, 0.02]), ("vllm", "chat", 0.1, [0.03, 0.04]), ("inproc", "tokens", 0.01, [0.01]),
        )
    ]  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps({"meta": {"mode": "test", "started": "now"}, "scenarios": recs}))
    svg = write_figure(tmp_path).read_text()
    assert "stream c8: derender vs chat" in svg
    assert "ours derender (1.000 events/token)" in svg and "vllm chat (1.000 events/token)" in svg
    assert "gap between token-carrying events" in svg
