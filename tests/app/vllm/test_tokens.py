"""Tokens level: wire shape (vLLM's own pydantic models), parity with vLLM's server (in process over
the scripted engine, tests/app/vllm/conftest.py; the README's curl on a real engine:
tests/engine/decode/test_levels.py).

Aborts and disconnects are tested in process (tests/app/runtime/test_aborts.py), and so are the service
rules (unknown ids and fields, wrong types, X-Request-Id, the service endpoints:
tests/app/generate/test_tokens.py)."""

from __future__ import annotations

import pytest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateTokensResponse,
    GenerateTokensStreamResponse,
)

from tests.support import choice_chunks, finish_reason, joined_tokens, post, same_chunking, scripted, sse_events


IM_END = 151645
PROMPT = [9707, 1879]
SCRIPT = [9707, 11, 1879, 0, 220, 9707, 1879]  # "Hello, world! Hello world"


def test_tokens_batch_follows_the_script_and_parses_as_vllms_model(server):
    r = post(server.url, scripted(PROMPT, SCRIPT, request_id="batch-1", sampling_params={"max_tokens": 32}))
    assert r.status_code == 200, r.text
    parsed = GenerateTokensResponse.model_validate(r.json())
    choice = parsed.choices[0]
    assert choice.token_ids == SCRIPT + [IM_END]
    assert choice.finish_reason == "stop"
    assert choice.stop_reason is None
    assert parsed.request_id == "generate-tokens-batch-1", "vLLM's generate names it generate-tokens-<id>"
    assert parsed.usage.completion_tokens == len(SCRIPT) + 1
    assert r.headers["x-request-id"] == "batch-1"


def test_tokens_stream_chunks_parse_as_vllms_model_and_end_with_usage_and_done(server):
    body = scripted(PROMPT, SCRIPT, stream_options={"include_usage": True}, return_token_ids=True)
    events = sse_events(server.url, body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for chunk in chunks:
        GenerateTokensStreamResponse.model_validate(chunk)
    assert chunks[0]["prompt_token_ids"] == PROMPT
    assert "prompt_token_ids" not in chunks[1]
    assert joined_tokens(events) == SCRIPT + [IM_END]
    assert finish_reason(events) == "stop"
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 2, "completion_tokens": len(SCRIPT) + 1, "total_tokens": 10}


def test_integer_logprobs_have_the_sampled_token_first(server):
    r = post(server.url, scripted(PROMPT, SCRIPT[:3], sampling_params={"logprobs": 3}))
    content = GenerateTokensResponse.model_validate(r.json()).choices[0].logprobs.content
    assert [c.token_id for c in content] == SCRIPT[:3] + [IM_END]
    for entry in content:
        assert entry.top_logprobs[0].token_id == entry.token_id
        assert len(entry.top_logprobs) >= 3


@pytest.mark.parametrize("stream", [False, True])
def test_tokens_level_equals_vllms_own_generate(server, vllm_server, stream):
    body = scripted(
        PROMPT, SCRIPT, sampling_params={"max_tokens": 5, "logprobs": 2}, stream_options={"include_usage": True}
    )
    if not stream:
        ours, theirs = post(server.url, body).json(), post(vllm_server.url, body).json()
        for key in ("usage", "output_mode", "prompt_token_ids", "kv_transfer_params"):
            assert ours[key] == theirs[key], key
        for a, b in zip(ours["choices"], theirs["choices"], strict=True):
            assert a == b
        assert set(ours) == set(theirs)
        return
    ours, theirs = sse_events(server.url, body), sse_events(vllm_server.url, body)
    assert joined_tokens(ours) == joined_tokens(theirs) == SCRIPT[:5]
    assert finish_reason(ours) == finish_reason(theirs) == "length"
    assert ours[-2]["usage"] == theirs[-2]["usage"]
    # Chunk by chunk where the engine split the tokens the same way (timing decides it).
    if same_chunking(choice_chunks(ours), choice_chunks(theirs)):
        strip = lambda events: [{k: v for k, v in e.items() if k != "request_id"} for e in events[:-1]]  # noqa: E731
        assert strip(ours) == strip(theirs)
