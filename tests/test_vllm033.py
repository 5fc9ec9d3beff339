"""The vLLM 0.33 tier, on this CPU venv: tests/vllm033 in its own pytest session with 0.33's
pure-Python modules first on the path (a process imports one vLLM). It fails with that session's
output, or with why the wheel could not be had (tests/vllm_wheel.py); it is never skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import vllm_wheel

ROOT = Path(__file__).resolve().parent.parent


def test_the_vllm_033_tier_passes_on_vllm_033s_modules():
    try:
        paths = vllm_wheel.ensure()
    except vllm_wheel.WheelUnavailable as e:
        pytest.fail(f"vLLM {vllm_wheel.VERSION}'s wheel is needed for this tier: {e}", pytrace=False)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)]),
        "VLLM_TARGET_DEVICE": "cpu",
        # vLLM keys its model-class cache by class name, not version: a cache shared with 0.32 is
        # stale for each line in turn, and a miss inspects the class in a subprocess (~10 s).
        "VLLM_CACHE_ROOT": str(vllm_wheel.CACHE / "vllm-cache-root"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/vllm033", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert done.returncode == 0, f"tests/vllm033 on vLLM {vllm_wheel.VERSION} failed:\n{done.stdout[-12000:]}\n{done.stderr[-3000:]}"
