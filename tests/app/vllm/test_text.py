"""Text level: parity with vLLM's own generate text mode, the case matrix (in process over the
scripted engine, tests/app/vllm/conftest.py; a bad request on a real engine: tests/engine/decode/test_levels.py).

The request rules (bad requests, the context length, unknown keys, tokens-only) run in process:
tests/app/generate/test_text.py and tests/app/generate/test_admission.py."""

from __future__ import annotations

import concurrent.futures
import functools

import httpx
import pytest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateTextResponse, GenerateTextStreamResponse

from tests.support import (
    choice_chunks,
    finish_reason,
    joined_text,
    joined_tokens,
    post,
    same_chunking,
    scripted,
    sent_together,
    sse_events,
)


PROMPT = [9707, 1879]
IM_END = 151645
IM_START = 151644


def _script(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


# (name, text to script, extra sampling params)
CASES = [
    ("plain_ascii", "Hello, world! This is plain text.", {}),
    ("emoji_and_cjk_byte_fallback", "Emoji 😀🎉 and 你好世界 and 🇫🇷", {}),
    ("stop_string_spanning_tokens", "The quick brown fox jumps over the lazy dog", {"stop": ["brown fox jumps"]}),
    ("stop_at_first_token", "Hello there", {"stop": ["Hello"]}),
    ("two_stop_strings", "alpha beta gamma delta", {"stop": ["delta", "gamma"]}),
    ("include_stop_str_in_output", "alpha beta gamma delta", {"stop": ["gamma"], "include_stop_str_in_output": True}),
    ("stop_token_ids", "one two three four", {"stop_token_ids": [2326]}),
    ("skip_special_tokens_false", "<|im_start|>inside<|im_end|> after", {"skip_special_tokens": False, "ignore_eos": True, "max_tokens": 8}),
    ("top20_logprobs", "Logprobs 😀 here", {"logprobs": 20}),
    ("n2", "Two choices, same script", {"n": 2}),
    ("max_tokens_length", "This will be cut off before the end", {"max_tokens": 4}),
    ("ignore_eos", "short", {"ignore_eos": True, "max_tokens": 6}),
]


def _body(tokenizer, text: str, sampling: dict, **fields) -> dict:
    return scripted(PROMPT, _script(tokenizer, text), output_mode="text", sampling_params=dict(sampling), **fields)


@pytest.fixture(scope="module")
def batch_answers(server, vllm_server, tokenizer) -> dict[str, tuple[concurrent.futures.Future, concurrent.futures.Future]]:
    """Case name -> our batch answer and vLLM's, the cases without logprobs sent at once. Logprobs
    are not independent of what else the engine runs (two engines batching different neighbours may
    round a logit differently), so the logprobs case is sent alone, in its test."""
    return sent_together({
        name: tuple(functools.partial(post, url, _body(tokenizer, text, sampling)) for url in (server.url, vllm_server.url))
        for name, text, sampling in CASES
        if "logprobs" not in sampling
    })


@pytest.mark.parametrize("name,text,sampling", CASES, ids=[c[0] for c in CASES])
def test_text_batch_equals_vllms_generate_text_mode(server, vllm_server, tokenizer, batch_answers, name, text, sampling):
    if name in batch_answers:
        ours, theirs = (answer.result() for answer in batch_answers[name])
    else:
        body = _body(tokenizer, text, sampling)
        ours, theirs = post(server.url, body), post(vllm_server.url, body)
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    ours, theirs = ours.json(), theirs.json()
    GenerateTextResponse.model_validate(ours)
    assert ours["usage"] == theirs["usage"]
    assert ours["choices"] == theirs["choices"]


@pytest.mark.parametrize("name,text,sampling", CASES, ids=[c[0] for c in CASES])
def test_text_stream_equals_vllms_generate_text_mode(server, vllm_server, tokenizer, name, text, sampling):
    body = _body(tokenizer, text, sampling, stream_options={"include_usage": True})
    ours, theirs = sse_events(server.url, body), sse_events(vllm_server.url, body)
    for chunk in ours[:-1]:
        GenerateTextStreamResponse.model_validate(chunk)
    for i in range(sampling.get("n", 1)):
        assert joined_text(ours, i) == joined_text(theirs, i)
        assert joined_tokens(ours, i) == joined_tokens(theirs, i)
        assert finish_reason(ours, i) == finish_reason(theirs, i)
        # Chunk by chunk where the engine happened to split the tokens the same way
        # (usually; under load it may batch two steps into one output).
        if same_chunking(choice_chunks(ours, i), choice_chunks(theirs, i)):
            assert choice_chunks(ours, i) == choice_chunks(theirs, i)
    assert ours[-2]["usage"] == theirs[-2]["usage"]


def test_stop_string_is_cut_from_text_but_token_ids_keep_every_token(server, tokenizer):
    text = "The quick brown fox jumps over the lazy dog"
    script = _script(tokenizer, text)
    body = _body(tokenizer, text, {"stop": ["fox"]})
    choice = post(server.url, body).json()["choices"][0]
    assert choice["text"] == "The quick brown "
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == "fox"
    assert choice["token_ids"] == script[: len(choice["token_ids"])]
    assert tokenizer.decode(choice["token_ids"]).endswith("fox")


def test_final_chunk_carries_only_held_back_text(server, tokenizer):
    # "ab" could start the stop string "abc", so it is held back until the engine finishes.
    text = "xyz ab"
    body = _body(tokenizer, text, {"stop": ["abc"]})
    events = sse_events(server.url, body)
    chunks = choice_chunks(events)
    last = chunks[-1]
    assert joined_text(events) == text
    assert last["finish_reason"] == "stop"
    # A real engine hands a reader that fell behind its missed steps as one merged delta, so the last
    # chunk may carry more tokens than EOS; the held-back "ab" reaches only the last chunk either way.
    assert last["token_ids"][-1] == IM_END and last["text"].endswith("ab")
    assert "ab" not in "".join(c["text"] for c in chunks[:-1]), chunks


def test_top_logprobs_resolve_strings_and_bytes(server, tokenizer):
    text = "😀"
    body = _body(tokenizer, text, {"logprobs": 5})
    content = post(server.url, body).json()["choices"][0]["logprobs"]["content"]
    script = _script(tokenizer, text)
    assert len(content) == len(script) + 1
    for entry in content:
        assert len(entry["top_logprobs"]) >= 5
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["bytes"] is not None


# ---------------------------------------------------------------- vLLM's completions derender


@pytest.mark.parametrize("name,text,sampling", [CASES[0], CASES[1], CASES[2], CASES[5]], ids=lambda c: c if isinstance(c, str) else "")
def test_our_tokens_through_vllms_completions_derender_give_our_text(server, vllm_server, tokenizer, name, text, sampling):
    body = _body(tokenizer, text, sampling)
    ours_text = post(server.url, body).json()["choices"][0]["text"]
    tokens_response = post(server.url, {**body, "output_mode": "tokens"}).json()
    r = httpx.post(
        vllm_server.url + "/v1/completions/derender",
        json={"generate_responses": [tokens_response], "prompt_token_ids": [PROMPT], "prompt_tokens": [len(PROMPT)]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    derendered = r.json()["choices"][0]["text"]
    if sampling.get("stop"):
        # The RFC's prefix rule: token_ids keep the tokens that completed the stop string,
        # so derender's text starts with ours and differs only after it.
        assert derendered.startswith(ours_text)
        if not sampling.get("include_stop_str_in_output"):
            assert derendered != ours_text
    else:
        assert derendered == ours_text
