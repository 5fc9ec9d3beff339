"""On vLLM 0.33's modules: our app and 0.33's own API server, in process over the same scripted
engine outputs, answer the differential corpus and the 0.33 cases (`tests/vllm033/cases.py`)
alike, batch and stream, every level, except the differences docs/vllm-differences.md lists for
0.33 (the ids in `tests/vllm033/allowed.py`)."""

from __future__ import annotations

import re
import time

import pytest

from tests.support.differential_corpus import CORPUS
from tests.app.vllm.test_differential import DOC, Result, _send, report
from tests.vllm033.allowed import ALLOWED_033, classified
from tests.vllm033.cases import CASES_033
from tests.support.pair import Pair

CASES = [*CORPUS, *CASES_033]


async def _answers(pair: Pair) -> dict[str, tuple[Result, Result]]:
    return {case.id: (await _send(pair.ours.client, "", case), await _send(pair.theirs.client, "", case)) for case in CASES}


@pytest.fixture(scope="module")
def outcomes(pair):
    started = time.monotonic()
    answers = pair.run(_answers(pair))
    print(f"\n{len(CASES)} cases against both apps in {time.monotonic() - started:.1f} s")
    return {case.id: (answers[case.id], classified(case, *answers[case.id])) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_answer_equals_vllm_033s_or_a_listed_difference(case, outcomes):
    (a, b), items = outcomes[case.id]
    if any(e is None for _, e in items):
        pytest.fail(report(case, a, b, items), pytrace=False)


# Entries whose requests another module sends (with the divergence asserted there).
EXERCISED_ELSEWHERE = {"stream-refused-before-first-chunk": "tests/vllm033/test_engine_errors.py"}


def test_every_entry_is_still_needed(outcomes):
    used = {e.id for _, items in outcomes.values() for _, e in items if e is not None}
    assert not {e.id for e in ALLOWED_033} - used - set(EXERCISED_ELSEWHERE), "entries no request needs: drop them"


def test_every_entry_is_in_the_docs_033_section():
    section = DOC.read_text().split("\n## On vLLM 0.33", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\{#([a-z0-9-]+)\}", section)) | set(re.findall(r"\(#([a-z0-9-]+)\)", section))
    assert not {e.id for e in ALLOWED_033} - named, f"not in docs/vllm-differences.md's 0.33 section: {sorted({e.id for e in ALLOWED_033} - named)}"
