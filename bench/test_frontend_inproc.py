"""bench.frontend_inproc's aggregation and report, without an engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.frontend_inproc import aggregate, write_report


def _rec(system: str, level: str, rep: int, cpu: float, c: int = 8, errors: int = 0) -> dict:
    summary = {"errors": errors, "truncated": False, "completed": 2 * c, "requests": 2 * c, "events_per_token": 1.0}
    return {"system": system, "level": level, "concurrency": c, "length": 256, "rep": rep, "summary": summary, "cpu_ms_per_token": cpu}


def test_ratios_and_overheads_per_repetition(tmp_path: Path) -> None:
    records = []
    for rep in range(3):
        records += [_rec("inproc", "tokens", rep, 0.1), _rec("ours", "derender", rep, 0.25 + 0.01 * rep), _rec("vllm", "chat", rep, 0.3)]
    records.append(_rec("ours", "tokens", 0, 0.01, errors=1))  # a run with an error is left out
    rows = {r["label"]: r for r in aggregate(records)}
    derender = rows["stream c8: derender vs chat"]
    assert derender["cpu_ratio"]["median"] == pytest.approx(0.26 / 0.3, abs=1e-4)
    assert derender["overhead_ratio"]["min"] == pytest.approx(0.75) and derender["overhead_ratio"]["max"] == pytest.approx(0.85)
    assert rows["stream c8: tokens vs tokens"]["cpu_ratio"]["n"] == 0
    meta = {"started": "now", "argv": ["--repeat", "3"], "commit": "abc", "vllm": "0.32.0", "repeat": 3, "length": 256, "duration_s": 1}
    (tmp_path / "results.json").write_text(json.dumps({"meta": meta, "records": records}))
    write_report(tmp_path)
    md = (tmp_path / "results.md").read_text()
    assert "| stream c8: derender vs chat | 0.867 [0.833–0.900] IQR 0.033 | 0.800 [0.750–0.850] |" in md
    assert "`python -m bench.frontend_inproc --repeat 3` at commit abc" in md
