"""On vLLM 0.33's modules: derender (batch and stream) equals 0.33's own coupled chat fed the same
scripted outputs (qwen3 reasoning + hermes tools). Chat renders the conversation; the derender
request carries that rendered prompt and the parse_context /render would return. With thinking off
the rendered prompt closes reasoning (`<think>\n\n</think>\n\n`): 0.33 hands the prompt to the
reasoning parser (`set_prompt_token_ids`), so the output parses as content, batch and stream (on
0.32 the batch parse still read it as reasoning)."""

from __future__ import annotations

import json
import re

import pytest

from tests.support import GENERATE
from tests.support.pair import Pair

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
OUTPUTS = {
    "reasoning_then_content": "<think>\nshort\n</think>\n\nHello there.",
    "reasoning_then_tool_call": '<think>\nneed weather\n</think>\n\n<tool_call>\n{"name": "get_weather", '
                                '"arguments": {"city": "Paris"}}\n</tool_call>',
    "content_only": "Hello, world!",
}
_CALL_ID = re.compile(r'"(chatcmpl-tool-|call_)[0-9a-zA-Z]+"')


def _events(text: str) -> list:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def _norm(obj) -> str:
    return _CALL_ID.sub('"<tool-call-id>"', json.dumps(obj, sort_keys=True))


async def _pairs(pair: Pair, include_reasoning: bool, template_kwargs: dict) -> dict:
    out = {}
    ours, theirs = pair.ours, pair.theirs
    tok = theirs.llm.tokenizer
    for name, text in OUTPUTS.items():
        script = tok.encode(text, add_special_tokens=False)
        for stream in (False, True):
            chat = {"model": "demo", "messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS,
                    "include_reasoning": include_reasoning, "stream": stream, "logprobs": True, "top_logprobs": 2,
                    "chat_template_kwargs": template_kwargs, "vllm_xargs": {"replay_token_ids": script}}
            r = await theirs.client.post("/v1/chat/completions", json=chat)
            prompt = theirs.core.seen[-1].prompt_token_ids
            body = {"token_ids": prompt, "output_mode": "derender", "stream": stream,
                    "sampling_params": {"logprobs": 2, "extra_args": {"replay_token_ids": script}},
                    "parse_context": {"tools": TOOLS, "tool_choice": "auto", "include_reasoning": include_reasoning,
                                      "chat_template_kwargs": template_kwargs}}
            g = await ours.client.post(GENERATE, json=body)
            assert r.status_code == g.status_code == 200, (name, r.text, g.text)
            if stream:
                theirs_c = [c for e in _events(r.text) for c in e["choices"]]
                ours_c = [c for e in _events(g.text) for c in e["choices"]]
                keys = ("index", "delta", "finish_reason", "logprobs")
                out[(name, stream)] = ([{k: c.get(k) for k in keys} for c in ours_c],
                                       [{k: c.get(k) for k in keys} for c in theirs_c])
            else:
                a, b = g.json()["choices"][0], r.json()["choices"][0]
                out[(name, stream)] = ({k: a.get(k) for k in ("message", "finish_reason", "logprobs")},
                                       {k: b.get(k) for k in ("message", "finish_reason", "logprobs")})
    return out


THINKING_OFF = {"enable_thinking": False}


@pytest.mark.parametrize(("include_reasoning", "template_kwargs"), [(True, {}), (False, {}), (True, THINKING_OFF)],
                         ids=["reasoning-shown", "reasoning-hidden", "prompt-closes-reasoning"])
def test_derender_equals_vllm_033s_coupled_chat(pair, include_reasoning, template_kwargs):
    pairs = pair.run(_pairs(pair, include_reasoning, template_kwargs))
    assert len(pairs) == 2 * len(OUTPUTS)
    differ = {key: (ours, theirs) for key, (ours, theirs) in pairs.items() if _norm(ours) != _norm(theirs)}
    assert not differ, "\n".join(f"{k}:\n ours  {_norm(o)[:1500]}\n chat  {_norm(t)[:1500]}" for k, (o, t) in differ.items())
    shown = pairs[("reasoning_then_tool_call", False)][0]
    assert shown["finish_reason"] == "tool_calls" and shown["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    if template_kwargs == THINKING_OFF:  # the prompt reached the reasoning parser: content, not reasoning
        for stream in (False, True):
            ours = pairs[("content_only", stream)][0]
            said = ours["message"] if not stream else {
                k: "".join((c["delta"] or {}).get(k) or "" for c in ours) or None for k in ("content", "reasoning")}
            assert (said["content"], said.get("reasoning")) == ("Hello, world!", None), (stream, ours)
