"""On vLLM 0.33's modules: our app and 0.33's own API server, in process over the same scripted
engine outputs, answer the differential corpus alike, batch and stream, every level, except the
differences docs/vllm-differences.md lists for 0.33 (the ids in `tests/vllm033/allowed.py`)."""

from __future__ import annotations

import time

import pytest

from tests.differential_corpus import CORPUS
from tests.test_vllm_differential import Result, _send, report
from tests.vllm033.allowed import classified
from tests.vllm033.pair import Pair


async def _answers(pair: Pair) -> dict[str, tuple[Result, Result]]:
    return {case.id: (await _send(pair.ours.client, "", case), await _send(pair.theirs.client, "", case)) for case in CORPUS}


@pytest.fixture(scope="module")
def outcomes(pair):
    started = time.monotonic()
    answers = pair.run(_answers(pair))
    print(f"\n{len(CORPUS)} corpus cases against both apps in {time.monotonic() - started:.1f} s")
    return {case.id: (answers[case.id], classified(case, *answers[case.id])) for case in CORPUS}


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_answer_equals_vllm_033s_or_a_listed_difference(case, outcomes):
    (a, b), items = outcomes[case.id]
    if any(e is None for _, e in items):
        pytest.fail(report(case, a, b, items), pytrace=False)
