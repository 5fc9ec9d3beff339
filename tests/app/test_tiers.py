"""tests/tiers.py, the runner behind `./dev test`: which tiers run side by side, and that a tier
that fails ends the tiers beside it at once, with its exit status (fail fast without waiting for
the slowest neighbour)."""

from __future__ import annotations

from pathlib import Path

from tests import tiers
from tests.tiers import Tier


def test_in_process_tiers_run_side_by_side_and_the_engine_tier_alone():
    phases = [[tier.name for tier, _ in phase] for phase in tiers._phases(tiers.plan([]))]
    assert phases == [["app", "vllm033", "deploy"], ["engine"]]
    # A path in one tier runs that tier only, alone or not.
    assert [[t.name for t, _ in p] for p in tiers._phases(tiers.plan(["tests/engine"]))] == [["engine"]]


def test_a_failing_tier_stops_the_one_beside_it_and_its_status_is_the_runs(tmp_path: Path, capsys):
    (tmp_path / "test_fails.py").write_text("def test_fails():\n    assert False, 'planted'\n")
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_slow():\n    time.sleep(120)\n")
    phase = [
        (Tier("slow", str(tmp_path)), [str(tmp_path / "test_slow.py"), "-p", "no:cacheprovider"]),
        (Tier("fails", str(tmp_path)), [str(tmp_path / "test_fails.py"), "-p", "no:cacheprovider"]),
    ]
    done: list[str] = []
    code = tiers._run_phase(phase, tmp_path, filtered=False, done=done)
    assert code == 1, done  # pytest's "tests failed"
    # Waited for, the slow tier would have passed (status 0) after 120 s; stopped, it ends non-zero.
    assert [entry.split()[0] for entry in done] == ["fails", "slow"], done
    assert done[0].endswith("failed (1)") and done[1].endswith(": stopped"), done
    out = capsys.readouterr().out
    assert "AssertionError: planted" in out, "the failing tier's output is printed"
