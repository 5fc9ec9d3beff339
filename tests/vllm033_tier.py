"""The vLLM 0.33 tier as a session beside the suite (tests/beside.py): tests/vllm033 in its own pytest
session with 0.33's pure-Python modules first on the path (a process imports one vLLM;
tests/vllm_wheel.py has them).

It is one single-threaded process of 2-3 minutes that shares nothing with the main session, so
conftest starts it once collection selects tests/test_vllm033.py and it runs on the second core
beside the rest of the suite; that test waits for its verdict."""

from __future__ import annotations

import os

from tests import beside, vllm_wheel


def _env() -> dict[str, str]:
    try:
        paths = vllm_wheel.ensure()
    except vllm_wheel.WheelUnavailable as e:
        raise beside.CannotRun(f"vLLM {vllm_wheel.VERSION}'s wheel is needed for this tier: {e}") from e
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*paths, str(beside.ROOT)]),
        "VLLM_TARGET_DEVICE": "cpu",
        # vLLM keys its model-class cache by class name, not version: a cache shared with 0.32 is
        # stale for each line in turn, and a miss inspects the class in a subprocess (~10 s).
        "VLLM_CACHE_ROOT": str(vllm_wheel.CACHE / "vllm-cache-root"),
    }


TIER = beside.Session(f"tests/vllm033 on vLLM {vllm_wheel.VERSION}", _env)


def start() -> beside.Session:
    """The tier, started once per session."""
    return TIER.start(["tests/vllm033"])


def running() -> bool:
    """Whether the tier was started this session and has not finished."""
    return TIER.running()
