"""The derender level's rules, parser configurations and multi-token deltas, in process.

Route and service rules (parse_context, tool_choice, chat_request, the parser fingerprint), a
server without parsers, and `--stream-interval 4` (vLLM's OutputProcessor merges the steps, so the
scripted engine gives the same multi-token deltas a real one does) against vLLM's own coupled chat
over the same engine. The derender level's real-engine checks stay in tests/app/vllm/test_derender.py
(coupled-chat parity on replayed tokens); the fingerprint's in test_pd (a 409 at the prefill pool,
a pinned fingerprint served at the decode pool).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.generate import FINGERPRINT_HEADER as FINGERPRINT
from tests.support import chat_cases as cc
from tests.support.inprocess import PROMPT, InProcess, error_of, serve, vllm_serve
from tests.support.servers import PARSER_FLAGS
from tests.support import GENERATE, scripted

pytestmark = pytest.mark.anyio

IM_END = 151645


def _derender(chat: dict[str, Any], script: list[int], **fields: Any) -> dict[str, Any]:
    """A derender request carrying `chat`'s parse_context (the prompt does not matter to the rules)."""
    return scripted(PROMPT, script, output_mode="derender", parse_context=cc.parse_context(chat), **fields)


def _deltas(events: list[Any], index: int = 0) -> list[dict[str, Any]]:
    return [c for e in events if isinstance(e, dict) for c in e.get("choices", []) if c["index"] == index]


# ---------------------------------------------------------------- rules


async def test_parser_configured_and_no_context_is_a_400(inproc):
    req = _derender(cc.chat_body(), [9707])
    del req["parse_context"]
    code, message, _ = error_of(await inproc.client.post(GENERATE, json=req))
    assert code == 400 and "parse_context" in message


async def test_named_tool_choice_matching_no_tool_is_a_400(inproc):
    req = _derender(cc.chat_body(tools=[cc.WEATHER]), [9707])
    req["parse_context"]["tool_choice"] = {"type": "function", "function": {"name": "nope"}}
    code, message, _ = error_of(await inproc.client.post(GENERATE, json=req))
    assert code == 400 and "'nope'" in message


async def test_unknown_parse_context_field_is_a_400_only_at_derender(inproc):
    req = _derender(cc.chat_body(), [9707])
    req["parse_context"]["future_knob"] = 1
    code, message, _ = error_of(await inproc.client.post(GENERATE, json=req))
    assert code == 400 and "render server is newer" in message
    r = await inproc.client.post(GENERATE, json={**req, "output_mode": "tokens"})
    assert r.status_code == 200, r.text


async def test_chat_request_needs_derender_and_excludes_parse_context(inproc):
    req, chat_request = _derender(cc.chat_body(), [9707]), cc.chat_body()
    r = await inproc.client.post(GENERATE, json={**req, "output_mode": "text", "chat_request": chat_request, "parse_context": None})
    code, message, _ = error_of(r)
    assert code == 400 and "chat_request" in message
    code, message, _ = error_of(await inproc.client.post(GENERATE, json={**req, "chat_request": chat_request}))
    assert code == 400 and "not both" in message


# ---------------------------------------------------------------- config drift


async def _fingerprint(s: InProcess) -> str:
    return (await s.client.get("/v1/models")).json()["data"][0]["parser_fingerprint"]


async def test_parser_fingerprint_is_published_and_a_mismatch_is_a_409(inproc):
    fingerprint = await _fingerprint(inproc)
    req = _derender(cc.chat_body(), [9707])
    r = await inproc.client.post(GENERATE, json=req, headers={FINGERPRINT: fingerprint})
    assert r.status_code == 200 and r.headers[FINGERPRINT] == fingerprint
    code, message, param = error_of(await inproc.client.post(GENERATE, json=req, headers={FINGERPRINT: "0123456789abcdef"}))
    assert (code, param) == (409, FINGERPRINT)
    assert "0123456789abcdef" in message and fingerprint in message
    assert (await inproc.client.post(GENERATE, json=req)).status_code == 200, "off unless the caller sends one"


async def test_fingerprint_depends_on_the_parsers(inproc, demo_model):
    async with serve(demo_model) as plain:
        assert await _fingerprint(plain) != await _fingerprint(inproc)


# ---------------------------------------------------------------- no parsers


async def test_plain_text_becomes_content_without_a_parser(demo_model, tokenizer):
    text = "<think>\nraw\n</think>\n\nvisible"
    req = scripted(PROMPT, cc.script_for(tokenizer, text), output_mode="derender")
    async with serve(demo_model) as plain:
        r = await plain.client.post(GENERATE, json=req)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"] == {
            "role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
            "function_call": None, "reasoning": None,
        }, "every key vLLM's ChatMessage writes"
        deltas = _deltas(await plain.events(req))
    assert deltas[0]["delta"] == {"role": "assistant", "content": ""}, "a role-only chunk first, as coupled chat"
    assert cc.accumulate([c["delta"] for c in deltas])["content"] == text


# ---------------------------------------------------------------- multi-token deltas

MULTI_TOKEN_CASES = {
    "reasoning_then_content": ("<think>\nThe user asks about weather.\n</think>\n\nIt is sunny in Paris.", {}),
    "reasoning_then_tool_call": (
        "<think>\nI should call the tool.\n</think>\n\n" + cc.call("get_weather", {"city": "Paris"}), {"tools": [cc.WEATHER]}
    ),
    "two_parallel_calls": (
        cc.call("get_weather", {"city": "Paris"}) + "\n" + cc.call("get_time", {}),
        {"tools": [cc.WEATHER, cc.TIME], "chat_template_kwargs": {"enable_thinking": False}},
    ),
    "stop_string_inside_content": ("<think>\nok\n</think>\n\nThe answer is 4. STOP and more", {"stop": ["STOP"]}),
}


async def _coupled_stream(vllm: InProcess, chat: dict[str, Any], script: list[int]) -> list[dict[str, Any]]:
    """vLLM's coupled chat, streamed: its choice deltas."""
    events = []
    async with vllm.client.stream("POST", "/v1/chat/completions", json=cc.coupled_body(chat, script, stream=True)) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return [c for e in events for c in e.get("choices", [])]


async def test_multi_token_deltas_parse_as_vllms_coupled_chat(demo_model, tokenizer):
    async with vllm_serve(demo_model, *PARSER_FLAGS) as vllm, serve(demo_model, *PARSER_FLAGS, "--stream-interval", "4") as ours:
        for name, (text, chat) in MULTI_TOKEN_CASES.items():
            chat, script = cc.chat_body(**chat), cc.script_for(tokenizer, text)
            rendered = await vllm.client.post("/v1/chat/completions/render", json=chat)
            assert rendered.status_code == 200, rendered.text
            deltas = _deltas(await ours.events(cc.request_from_render(rendered.json(), chat, script)))
            assert max(len(c["token_ids"]) for c in deltas) > 1, (name, "the engine sent multi-token deltas")
            theirs = await _coupled_stream(vllm, chat, script)
            ours_message = cc.without_ids(cc.accumulate([c["delta"] for c in deltas]))
            assert ours_message == cc.without_ids(cc.accumulate([c["delta"] for c in theirs])), name
            assert deltas[-1]["finish_reason"] == [c for c in theirs if c.get("finish_reason")][-1]["finish_reason"], name
