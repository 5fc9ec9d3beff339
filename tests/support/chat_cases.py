"""Chat scenarios for the derender level, and the oracle plumbing around vLLM's own server.

A case is a chat request (messages, tools, tool_choice, ...) plus the text the
model should "write" (tokenized with the demo tokenizer into a replay script).
vLLM's `/v1/chat/completions/render` turns the chat request into the generate
request a render server would send us; vLLM's coupled `/v1/chat/completions`
on the same script is the oracle.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The current time", "parameters": {"type": "object", "properties": {}}},
}
USER = [{"role": "user", "content": "What's the weather in Paris?"}]

CHAT_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "include_reasoning", "chat_template_kwargs")


def call(name: str, args: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def chat_body(**chat: Any) -> dict[str, Any]:
    body = {"model": "demo", "messages": chat.pop("messages", USER), **chat}
    return body


def script_for(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def chat_prompt(tokenizer: Any, tools: list[dict[str, Any]]) -> list[int]:
    """The USER conversation with these tools, rendered by the tokenizer's chat template, as ids."""
    text = tokenizer.apply_chat_template(USER, tools=tools, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def rendered(vllm_url: str, chat: dict[str, Any]) -> Any:
    r = httpx.post(vllm_url + "/v1/chat/completions/render", json=chat, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def parse_context(chat: dict[str, Any]) -> dict[str, Any]:
    ctx = {k: chat[k] for k in CHAT_KEYS if k in chat}
    if "tools" in ctx and "tool_choice" not in ctx:
        ctx["tool_choice"] = "auto"
    return ctx


def derender_request(vllm_url: str, chat: dict[str, Any], script: list[int], **overrides: Any) -> dict[str, Any]:
    """What a render server sends us for `chat`: its generate request plus parse_context."""
    return request_from_render(rendered(vllm_url, chat), chat, script, **overrides)


def request_from_render(gen: dict[str, Any] | list[dict[str, Any]], chat: dict[str, Any], script: list[int], **overrides: Any) -> dict[str, Any]:
    """Our derender request from `gen`, vLLM's /v1/chat/completions/render answer for `chat`."""
    gen = gen[0] if isinstance(gen, list) else gen
    sampling = dict(gen["sampling_params"])
    sampling["extra_args"] = {**(sampling.get("extra_args") or {}), "replay_token_ids": script}
    sampling.update(overrides.pop("sampling_params", {}))
    req = {
        "token_ids": gen["token_ids"],
        "sampling_params": sampling,
        "output_mode": "derender",
        "parse_context": parse_context(chat),
        **{k: gen[k] for k in ("reasoning_ended", "reasoning_parser_kwargs") if gen.get(k) is not None},
    }
    req.update(overrides)
    return req


def coupled_body(chat: dict[str, Any], script: list[int], stream: bool) -> dict[str, Any]:
    """vLLM's coupled /v1/chat/completions request for `chat`, its output following `script`."""
    return {**chat, "vllm_xargs": {"replay_token_ids": script}, "stream": stream}


def coupled_chat(vllm_url: str, chat: dict[str, Any], script: list[int], stream: bool) -> Any:
    body = coupled_body(chat, script, stream)
    if not stream:
        r = httpx.post(vllm_url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()
    events = []
    with httpx.stream("POST", vllm_url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line[6:] != "[DONE]":
                events.append(json.loads(line[6:]))
    return events


def accumulate(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold stream deltas into a message: strings concatenated, tool calls gathered by index."""
    msg: dict[str, Any] = {"role": None, "content": None, "reasoning": None, "tool_calls": []}
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        if d.get("role"):
            msg["role"] = d["role"]
        for key in ("content", "reasoning"):
            if d.get(key):
                msg[key] = (msg[key] or "") + d[key]
        for tc in d.get("tool_calls") or []:
            slot = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            slot["id"] = slot["id"] or tc.get("id")
            fn = tc.get("function") or {}
            slot["name"] += fn.get("name") or ""
            slot["arguments"] += fn.get("arguments") or ""
    msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


def batch_message(message: dict[str, Any]) -> dict[str, Any]:
    """A batch ChatMessage in the same shape as `accumulate` gives."""
    return {
        "role": message["role"],
        "content": message.get("content") or None,
        "reasoning": message.get("reasoning") or None,
        "tool_calls": [
            {"id": tc["id"], "name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
            for tc in message.get("tool_calls") or []
        ],
    }


def without_ids(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "tool_calls": [{k: v for k, v in tc.items() if k != "id"} for tc in message["tool_calls"]]}
