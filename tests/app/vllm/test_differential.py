"""Differential test, on each vLLM line: every request of tests/support/differential_corpus.py (and on
0.33 the 0.33 cases, tests/vllm033/cases.py) goes to that line's own API server (`vllm_server`) and to
ours (`server`), same flags, both in process over the same scripted engine outputs and each on a
loopback socket (tests/app/vllm/conftest.py), and the answers are compared (tests/support/differential.py).

Every divergence must be matched by an entry of the line's list in tests/support/allowed.py (a
deliberate difference, documented under the same id in docs/vllm-differences.md's section for the
line) or of `PENDING_FIXES` (a known difference that the server will lose: the case xfails,
strict=False). Anything else fails, showing the case id, both statuses and a compact diff.

`PENDING_FIXES` is temporary: when the fixes land, delete the entries that no longer match
(`test_pending_fix_entries_still_match` lists them). The tests/app tier runs this module on 0.32,
the tests/vllm033 tier on 0.33's modules (tests/tiers.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass

import httpx
import pytest

from decode_server.compat import VLLM_LINE
from tests.support.allowed import EXERCISED_ELSEWHERE, ON_LINE, PENDING_FIXES, classified
from tests.support.differential import DOC, Divergence, Entry, Result, chunked_alike, compare, report, run_corpus
from tests.support.differential_facts import SP_FIELDS
from tests.support.differential_corpus import CORPUS, GENERATED, HAND_WRITTEN, Case
from tests.vllm033.cases import CASES_033

ALLOWED = ON_LINE[VLLM_LINE]
CASES = [*CORPUS, *CASES_033] if VLLM_LINE == "0.33" else CORPUS


# ---------------------------------------------------------------- tests


@dataclass
class Outcome:
    ours: Result
    theirs: Result
    items: list[tuple[Divergence, Entry | None]]


@pytest.fixture(scope="module")
def outcomes(server, vllm_server) -> dict[str, Outcome]:
    started = time.monotonic()
    results = asyncio.run(run_corpus(server.url, vllm_server.url, CASES))
    elapsed = time.monotonic() - started
    print(f"\ndifferential corpus on vLLM {VLLM_LINE}: {len(CASES)} cases ({len(HAND_WRITTEN)} hand-written, "
          f"{len(GENERATED)} generated, {len(CASES) - len(CORPUS)} of the line's own) against both servers in {elapsed:.1f} s")
    out = {}
    for case in CASES:
        a, b = results[case.id]
        out[case.id] = Outcome(a, b, classified(case, a, b))
    streams = [o for o in out.values() if o.ours.kind == o.theirs.kind == "sse"]
    tally: dict[str, int] = {}
    for o in out.values():
        for e in {e.id if e else "UNEXPLAINED" for _, e in o.items}:
            tally[e] = tally.get(e, 0) + 1
    print(f"streams compared: {len(streams)} ({sum(chunked_alike(o.ours, o.theirs) for o in streams)} chunk by chunk, "
          f"the rest by concatenation); cases per difference: {dict(sorted(tally.items()))}")
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_answer_equals_vllms_or_a_listed_difference(case, outcomes):
    o = outcomes[case.id]
    unexplained = [d for d, e in o.items if e is None]
    if unexplained:
        pytest.fail(report(case, o.ours, o.theirs, o.items), pytrace=False)
    pending = sorted({e.id for _, e in o.items if e in PENDING_FIXES})
    if pending:
        pytest.xfail(f"pending fix {', '.join(pending)} (ours {o.ours.status}, vLLM {o.theirs.status})")


def test_corpus_covers_every_field_of_the_request_and_sampling_params():
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest

    assert len(HAND_WRITTEN) >= 100 and len(GENERATED) >= 30
    top = {k for c in HAND_WRITTEN if isinstance(c.body, dict) for k in c.body}
    sp = {k for c in HAND_WRITTEN if isinstance(c.body, dict) and isinstance(c.body.get("sampling_params"), dict)
          for k in c.body["sampling_params"]}
    assert not set(GenerateRequest.model_fields) - top, set(GenerateRequest.model_fields) - top
    assert not set(SP_FIELDS) - sp, set(SP_FIELDS) - sp
    assert any(c.body.get("stream") is True for c in HAND_WRITTEN if isinstance(c.body, dict))
    assert {c.body.get("output_mode", "tokens") for c in HAND_WRITTEN if isinstance(c.body, dict)} >= {"tokens", "text", "derender"}
    assert any("X-Request-Id" in c.headers for c in HAND_WRITTEN)


def _documented_ids() -> set[str]:
    """The ids the line's section of the doc heads (`{#id}`) or links to (`(#id)`)."""
    section = DOC.read_text().split(f"\n## On vLLM {VLLM_LINE}", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"\{#([a-z0-9-]+)\}", section)) | set(re.findall(r"\(#([a-z0-9-]+)\)", section))


def test_every_allowed_id_is_documented_and_the_lists_are_disjoint():
    ids = [e.id for e in ALLOWED]
    assert len(ids) == len(set(ids))
    assert not set(ids) - _documented_ids(), f"not in docs/vllm-differences.md's {VLLM_LINE} section: {set(ids) - _documented_ids()}"
    assert not set(ids) & {e.id for e in PENDING_FIXES}


def test_every_allowed_entry_is_still_exercised(outcomes):
    used = {e.id for o in outcomes.values() for _, e in o.items if e is not None} | set(EXERCISED_ELSEWHERE[VLLM_LINE])
    stale = [e.id for e in ALLOWED if e.id not in used]
    assert not stale, f"allow-list entries no case needs any more (remove them and their doc section): {stale}"


def test_pending_fix_entries_still_match(outcomes):
    used = {e.id for o in outcomes.values() for _, e in o.items if e is not None}
    fixed = [e.id for e in PENDING_FIXES if e.id not in used]
    if fixed:
        pytest.xfail(f"PENDING_FIXES entries that no longer match anything (fixed? delete them): {fixed}")


def test_both_servers_are_healthy_after_the_corpus(server, vllm_server, outcomes):
    for s in (server, vllm_server):
        assert httpx.get(s.url + "/health", timeout=10).status_code == 200, s.name


def test_the_comparison_sees_a_changed_field_key_order_an_id_and_a_stream_split():
    """The harness itself, on made-up answers (no servers): a silent comparison would pass everything."""
    case = Case("self_check", {"request_id": "x", "token_ids": [1], "sampling_params": {}})
    body = {"request_id": "generate-tokens-x", "created": 1, "choices": [{"index": 0, "token_ids": [1, 2]}], "usage": None}
    same = Result(200, "application/json", None, "json", json.loads(json.dumps(body)))
    assert compare(case, same, Result(200, "application/json", None, "json", body)) == []
    changed = json.loads(json.dumps(body))
    changed["choices"][0]["token_ids"] = [1, 3]
    reordered = {k: body[k] for k in ["created", "request_id", "choices", "usage"]}
    renamed = {**body, "request_id": "x"}
    wheres = lambda a: [d.where for d in compare(case, Result(200, "application/json", None, "json", a), same)]  # noqa: E731
    assert wheres(changed) == ["$.choices[0].token_ids[1]"]
    assert wheres(reordered) == ["${key order}"]
    assert wheres(renamed) == ["request_id"]
    chunk = lambda ids, fin=None: {"request_id": "generate-tokens-x", "choices": [{"index": 0, "token_ids": ids, "finish_reason": fin}]}  # noqa: E731
    one = Result(200, "text/event-stream", None, "sse", [chunk([1]), chunk([2], "stop"), "[DONE]"])
    split = Result(200, "text/event-stream", None, "sse", [chunk([1, 2], "stop"), "[DONE]"])
    lost = Result(200, "text/event-stream", None, "sse", [chunk([1], "stop"), "[DONE]"])
    assert compare(case, one, split) == []  # another engine split, same tokens
    assert [d.where for d in compare(case, one, lost)] == ["sse.choice[0].joined.token_ids.length"]
