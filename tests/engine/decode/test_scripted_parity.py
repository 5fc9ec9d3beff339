"""The scripted engine answers as the real one: the same bodies, sent to a real server and to the
app over the scripted engine, give the same responses (tokens, text and derender; batch and stream).

This is the one real-engine check behind the in-process tier: if the engine's stop rules, finish
and stop reasons, logprob shapes or output kinds drift from what the scripts assume, it fails here.

What legitimately differs, and is left out of the comparison:
- `created` (a timestamp) and tool-call ids (random);
- logprob values and the alternative tokens in a top-k list: dummy weights on the real engine,
  seeded random logits in the scripted one. Kept: each position's sampled token (id, text,
  bytes), how many alternatives it lists and their ranks (1..k);
- prompt logprob values and alternatives, likewise (kept: the prompt token, its decoded text,
  the number of entries and their ranks);
- stream chunking: the real engine may merge steps when the API server lags; chunks are compared
  one by one where both split the tokens the same way, else as accumulated choices.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.support.chat_cases import WEATHER, accumulate, call, without_ids
from tests.support.inprocess import serve
from tests.support.servers import PARSER_FLAGS
from tests.support import choice_chunks, post, same_chunking, scripted, sse_events

pytestmark = pytest.mark.real_engine

PROMPT = [9707, 1879]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def _cases(tokenizer) -> dict[str, dict[str, Any]]:
    def text(s: str) -> list[int]:
        return tokenizer.encode(s, add_special_tokens=False)

    hello = text("Hello, world! Hello there.")
    cases = {
        "tokens_logprobs": scripted(PROMPT, hello, sampling_params={"logprobs": 2, "prompt_logprobs": 1}, return_token_ids=True),
        "tokens_length": scripted(PROMPT, hello, sampling_params={"max_tokens": 3}),
        "tokens_ignore_eos": scripted(PROMPT, hello[:2], sampling_params={"ignore_eos": True, "max_tokens": 5}),
        "tokens_stop_token_id": scripted(PROMPT, hello, sampling_params={"stop_token_ids": [hello[2]]}),
        "tokens_n2": scripted(PROMPT, hello[:3], sampling_params={"n": 2, "seed": 1}),
        "text_stop_string": scripted(PROMPT, hello, output_mode="text", sampling_params={"stop": ["world"]}),
        "text_include_stop": scripted(
            PROMPT, hello, output_mode="text", sampling_params={"stop": ["there"], "include_stop_str_in_output": True}
        ),
        "text_min_tokens_past_the_script": scripted(PROMPT, hello[:2], output_mode="text", sampling_params={"min_tokens": 6}),
        "text_min_tokens_hold_a_stop_string": scripted(
            PROMPT, hello, output_mode="text", sampling_params={"stop": ["Hello"], "min_tokens": 3}
        ),
        "text_logprobs_bytes": scripted(PROMPT, text("Emoji 😀 ok"), output_mode="text", sampling_params={"logprobs": 2}),
        "derender_reasoning": scripted(
            PROMPT, text("<think>\nLet me see.\n</think>\n\nIt is sunny."), output_mode="derender", parse_context={}
        ),
        "derender_tool_call": scripted(
            PROMPT, text(call("get_weather", {"city": "Paris"})), output_mode="derender",
            parse_context={**NO_THINKING, "tools": [WEATHER], "tool_choice": "auto"},
        ),
        "derender_logprobs": scripted(
            PROMPT, hello[:3], output_mode="derender", parse_context=NO_THINKING, sampling_params={"logprobs": 2}
        ),
    }
    for name, body in cases.items():
        body["request_id"] = name
        body["stream_options"] = {"include_usage": True}
    return cases


# ------------------------------------------------------------------ what may differ, taken out


def _position(entry: dict[str, Any]) -> dict[str, Any]:
    top = entry.get("top_logprobs") or []
    return {
        **{k: entry[k] for k in ("token_id", "token", "bytes") if k in entry},
        # The first alternative is the sampled token itself; the rest are the top-k by rank.
        "top": [top[0].get("token_id", top[0].get("token"))] + [t.get("rank") for t in top[1:]] if top else [],
    }


def _prompt_position(token: int, entry: dict[str, Any] | None) -> Any:
    if entry is None:
        return None
    own = entry.get(str(token))
    return {"decoded": own and own["decoded_token"], "ranks": sorted(e["rank"] for k, e in entry.items() if k != str(token))}


def comparable(obj: Any, prompt: list[int] = PROMPT) -> Any:
    if isinstance(obj, list):
        return [comparable(x, prompt) for x in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for key, value in obj.items():
        if key == "created" or (key == "id" and "function" in obj):
            continue
        if key == "logprobs" and isinstance(value, dict) and value.get("content") is not None:
            value = {**value, "content": [_position(e) for e in value["content"]]}
        elif key == "prompt_logprobs" and value is not None:
            value = [_prompt_position(t, e) for t, e in zip(prompt, value, strict=True)]
        out[key] = comparable(value, prompt)
    return out


def _accumulated(events: list[Any]) -> dict[int, dict[str, Any]]:
    """Each choice of a stream folded: token ids, text, derender message, finish and stop reason."""
    folded: dict[int, dict[str, Any]] = {}
    for e in events:
        for c in e.get("choices", []) if isinstance(e, dict) else []:
            f = folded.setdefault(c["index"], {"token_ids": [], "text": "", "deltas": [], "logprobs": []})
            f["token_ids"] += c.get("token_ids") or []
            f["text"] += c.get("text") or ""
            f["deltas"] += [c["delta"]] if "delta" in c else []
            f["logprobs"] += comparable({"logprobs": c.get("logprobs")})["logprobs"]["content"] if c.get("logprobs") else []
            for key in ("finish_reason", "stop_reason"):
                if c.get(key) is not None:
                    f[key] = c[key]
    for f in folded.values():
        deltas = f.pop("deltas")
        f["message"] = without_ids(accumulate(deltas)) if deltas else None
    return folded


def _wrappers(events: list[Any]) -> list[Any]:
    return [{k: v for k, v in e.items() if k != "choices"} for e in events if isinstance(e, dict)]


# ------------------------------------------------------------------ the two tiers


def _real(url: str, cases: dict[str, dict[str, Any]]) -> dict[str, tuple[Any, list[Any]]]:
    out = {}
    for name, body in cases.items():
        r = post(url, body)
        assert r.status_code == 200, (name, r.text)
        out[name] = (r.json(), sse_events(url, body))
    return out


async def _scripted(demo_model, cases: dict[str, dict[str, Any]]) -> dict[str, tuple[Any, list[Any]]]:
    out = {}
    async with serve(demo_model, *PARSER_FLAGS) as s:
        for name, body in cases.items():
            r = await s.client.post("/inference/v1/generate", json=body)
            assert r.status_code == 200, (name, r.text)
            out[name] = (r.json(), await s.events(body))
    return out


def test_the_scripted_engine_answers_as_the_real_engine(server, demo_model, tokenizer):
    cases = _cases(tokenizer)
    real = _real(server.url, cases)
    fake = asyncio.run(_scripted(demo_model, cases))
    for name in cases:
        (real_batch, real_events), (fake_batch, fake_events) = real[name], fake[name]
        assert comparable(fake_batch) == comparable(real_batch), name
        assert real_events[-1] == fake_events[-1] == "[DONE]", name
        assert comparable(fake_events[-2]) == comparable(real_events[-2]), f"{name}: the usage chunk"
        assert _accumulated(fake_events) == _accumulated(real_events), name
        for i in _accumulated(real_events):  # how n > 1 choices interleave is engine timing
            fake_chunks, real_chunks = choice_chunks(fake_events, i), choice_chunks(real_events, i)
            if same_chunking(fake_chunks, real_chunks):
                assert comparable(fake_chunks) == comparable(real_chunks), f"{name}: choice {i} chunk by chunk"
        if len(fake_events) == len(real_events):
            assert comparable(_wrappers(fake_events)) == comparable(_wrappers(real_events)), f"{name}: chunk fields"
    # What the scripts rely on, seen on the real engine (so a change in vLLM shows up here by name).
    assert real["text_min_tokens_past_the_script"][0]["choices"][0]["finish_reason"] == "stop", (
        "the replay processor forces EOS past min_tokens: " + json.dumps(real["text_min_tokens_past_the_script"][0])
    )
    assert real["tokens_stop_token_id"][0]["choices"][0]["stop_reason"] == cases["tokens_stop_token_id"]["sampling_params"]["extra_args"]["replay_token_ids"][2]
