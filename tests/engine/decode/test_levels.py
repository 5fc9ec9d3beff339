"""What of the levels only a real engine shows, beside the scripted-engine parity
(test_scripted_parity.py): the README's curl, whose tokens are the model's own (no script), and the
one real-engine check of the fail-loud rules (the rules themselves: tests/app/generate/)."""

from __future__ import annotations

import pytest

from tests.support import post

pytestmark = pytest.mark.real_engine

PROMPT = [9707, 1879]


def test_readme_curl_example_answers_eight_tokens(server):
    r = post(server.url, {"token_ids": PROMPT, "sampling_params": {"max_tokens": 8}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["output_mode"] == "tokens"
    assert len(body["choices"][0]["token_ids"]) == 8
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10,
        "prompt_tokens_details": None, "completion_tokens_details": None,
    }


def test_a_bad_request_fails_loud_on_the_real_engine(server):
    """The one real-engine check of the fail-loud rules (the matrix runs in process:
    tests/app/generate/test_text.py; the tokens-only rules in tests/app/generate/test_admission.py)."""
    r = post(server.url, {"token_ids": [151936 + 5]})
    assert r.status_code == 400 and "out of the model's vocabulary" in r.json()["error"]["message"], r.text
