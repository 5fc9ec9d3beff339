"""The vLLM 0.33 tier, on this CPU venv (tests/vllm033_tier.py runs it beside the suite). It fails
with that session's output, or with why the wheel could not be had (tests/vllm_wheel.py); it is
never skipped."""

from __future__ import annotations

import pytest

from tests import vllm033_tier


def start_beside_the_suite(items: list[pytest.Item]) -> None:
    """Called by conftest at collection: the tier's process starts now and runs beside the suite."""
    vllm033_tier.start()


def test_the_vllm_033_tier_passes_on_vllm_033s_modules():
    failure = vllm033_tier.start().failure()  # started at collection, or now when run on its own
    if failure:
        pytest.fail(failure, pytrace=False)
