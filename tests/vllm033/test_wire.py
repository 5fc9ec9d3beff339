"""On vLLM 0.33's modules: our app and 0.33's own API server, in process over the same scripted
engine outputs, answer the differential corpus alike, batch and stream, every level, except the
differences docs/vllm-differences.md lists for 0.33 (the ids in `ALLOWED_033`)."""

from __future__ import annotations

import time

import pytest

from tests.differential_corpus import CORPUS, Case
from tests.test_vllm_differential import ALLOWED, Entry, Result, _send, compare, facts, report
from tests.vllm033.pair import Pair

# The 0.32 list's entries that still hold on 0.33, and 0.33's own.
_STILL = {"chat-request-outside-derender", "multimodal-fail-loud", "any-content-type", "x-request-id-echo",
          "bounded-request-ids", "minimal-body", "strict-booleans-and-ids", "first-of-several-errors"}
ALLOWED_033: list[Entry] = [e for e in ALLOWED if e.id in _STILL] + [
    Entry("derender-stream", "a derender stream is served (vLLM 0.33: 400 'does not support stream=true')",
          lambda c, f, d, a, b: "derender" in f and c.body.get("stream") is True and d.where == "status"
          and d.ours == 200 and d.theirs == 400 and "does not support stream=true" in b.message),
]


async def _answers(pair: Pair) -> dict[str, tuple[Result, Result]]:
    return {case.id: (await _send(pair.ours.client, "", case), await _send(pair.theirs.client, "", case)) for case in CORPUS}


@pytest.fixture(scope="module")
def outcomes(pair):
    started = time.monotonic()
    answers = pair.run(_answers(pair))
    print(f"\n{len(CORPUS)} corpus cases against both apps in {time.monotonic() - started:.1f} s")
    return {case.id: (answers[case.id], _classified(case, *answers[case.id])) for case in CORPUS}


def _classified(case: Case, a: Result, b: Result):
    f = facts(case)
    return [(d, next((e for e in ALLOWED_033 if e.match(case, f, d, a, b)), None)) for d in compare(case, a, b)]


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_answer_equals_vllm_033s_or_a_listed_difference(case, outcomes):
    (a, b), items = outcomes[case.id]
    if any(e is None for _, e in items):
        pytest.fail(report(case, a, b, items), pytrace=False)
