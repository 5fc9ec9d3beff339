"""The request rules around the text level, in process: bad requests fail loud with their cause,
the context length bounds max_tokens, unknown sampling keys are ignored and counted.

These are route and service rules (ours and vLLM's InputProcessor, both real here); the text
level's real-engine checks stay in tests/app/vllm/test_text.py (parity with vLLM's generate text mode).
The tokens-only rules are in tests/app/generate/test_admission.py; their real-engine check is
test_pd's tokens-only prefill pool.
"""

from __future__ import annotations

import logging

import pytest

from tests.support.inprocess import PROMPT, error_of
from tests.support import GENERATE, scripted

pytestmark = pytest.mark.anyio

IM_END = 151645


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


BAD_REQUESTS = [
    ("detokenize_false", {"output_mode": "text", "sampling_params": {"detokenize": False}}, "detokenize"),
    ("unknown_mode", {"output_mode": "poetry"}, "output_mode"),
    ("negative_id", {"token_ids": [-1]}, "token_ids"),
    ("id_beyond_vocab", {"token_ids": [151936 + 5]}, "out of the model's vocabulary"),
    ("empty", {"token_ids": []}, "token_ids"),
    ("n_above_max_num_seqs", {"sampling_params": {"n": 17}}, "max_num_seqs"),
    ("logprobs_above_max", {"sampling_params": {"logprobs": 21}}, "max_logprobs"),
    ("vllm_temperature", {"sampling_params": {"temperature": -1}}, "temperature must be non-negative"),
    ("vllm_top_p", {"sampling_params": {"top_p": 2}}, "top_p must be in (0, 1]"),
    ("multimodal", {"features": {"mm_hashes": {}, "mm_placeholders": {}}}, "multimodal input is not supported"),
    ("cache_salt_path", {"cache_salt": "../../etc"}, "cache_salt"),
    ("request_id_too_long", {"request_id": "x" * 300}, "at most 256 printable ASCII"),
    ("request_id_control_char", {"request_id": "bad\nid"}, "printable ASCII"),
    ("json_too_deep", {"sampling_params": {"extra_args": {"a": _nested(70)}}}, "deeper than 64"),
]


@pytest.mark.parametrize("fields,expected", [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
async def test_bad_requests_fail_loud_with_the_cause(inproc, fields, expected):
    r = await inproc.client.post(GENERATE, json={"token_ids": PROMPT, **fields})
    code, message, _ = error_of(r)
    assert code == 400 and expected in message, r.text
    assert inproc.core.seen == [], "refused before the engine"


async def test_max_tokens_beyond_the_context_stops_at_the_context_length_as_vllm(inproc):
    prompt = [9707] * 4090  # max_model_len 4096: room for 6 tokens
    r = await inproc.client.post(GENERATE, json=scripted(prompt, [], sampling_params={"max_tokens": 8, "ignore_eos": True}))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 6


async def test_unknown_sampling_keys_are_ignored_and_counted_as_vllm(inproc, caplog):
    caplog.set_level(logging.WARNING, logger="decode_server")
    body = scripted(PROMPT, [11], sampling_params={"temperatur": 0.5, "max_tokens": "4"})
    r = await inproc.client.post(GENERATE, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == [11, IM_END]
    assert inproc.core.seen[-1].sampling_params.max_tokens == 4, "a numeric string is coerced, as vLLM's pydantic does"
    assert await inproc.metric("decode_server_ignored_fields_total", field="sampling_params.temperatur") == 1
    assert "ignoring the unknown request field 'sampling_params.temperatur'" in caplog.text
