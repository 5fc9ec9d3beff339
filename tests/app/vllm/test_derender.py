"""Derender level: parity with vLLM's coupled /v1/chat/completions, batch and stream, both in process
over the same scripted engine outputs (tests/app/vllm/conftest.py).

Every case runs the same replayed tokens through (1) our batch derender,
(2) our streaming derender, (3) vLLM's coupled chat, batch and stream, and
compares the parsed messages (tool-call ids aside; their format is checked).
The derender rules, the parser fingerprint, a server without parsers and multi-token deltas
(--stream-interval 4) run in process: tests/app/generate/test_derender.py.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatMessage

from tests.support import chat_cases as cc
from tests.support import post, sent_together, sse_events



@dataclass
class Case:
    name: str
    text: str
    chat: dict[str, Any] = field(default_factory=dict)
    # Why our stream and batch may legitimately differ (vLLM's own stream/batch differ there too).
    stream_differs_from_batch: str | None = None


NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
CASES = [
    Case("plain_content", "Hello there, how can I help?", NO_THINK),
    Case("reasoning_only", "<think>\nThe user asks about weather. I am not sure"),
    Case("reasoning_then_content", "<think>\nThe user asks about weather.\n</think>\n\nIt is sunny in Paris."),
    Case("one_tool_call", cc.call("get_weather", {"city": "Paris"}), {"tools": [cc.WEATHER], **NO_THINK}),
    Case(
        "reasoning_then_tool_call",
        "<think>\nI should call the tool.\n</think>\n\n" + cc.call("get_weather", {"city": "Paris"}),
        {"tools": [cc.WEATHER]},
        stream_differs_from_batch="the '\\n\\n' between </think> and <tool_call> streams as content; batch drops whitespace-only content",
    ),
    Case(
        "two_parallel_calls",
        cc.call("get_weather", {"city": "Paris"}) + "\n" + cc.call("get_time", {}),
        {"tools": [cc.WEATHER, cc.TIME], **NO_THINK},
    ),
    # The structural tag /render sets for parallel_tool_calls=false admits one call only,
    # so the script writes one (a second forced call would be rejected by the grammar).
    Case(
        "parallel_tool_calls_false",
        cc.call("get_weather", {"city": "Paris"}),
        {"tools": [cc.WEATHER, cc.TIME], "parallel_tool_calls": False, **NO_THINK},
    ),
    Case(
        "named_tool_choice",
        cc.call("get_weather", {"city": "Paris"}),
        {"tools": [cc.WEATHER, cc.TIME], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, **NO_THINK},
        stream_differs_from_batch="batch forces content '' under a named tool_choice; the stream never sends content",
    ),
    Case(
        "tool_choice_required",
        cc.call("get_time", {}),
        {"tools": [cc.WEATHER, cc.TIME], "tool_choice": "required", **NO_THINK},
        stream_differs_from_batch="batch forces content '' under tool_choice 'required'",
    ),
    Case("tool_choice_none", "No tools needed: it is sunny.", {"tools": [cc.WEATHER], "tool_choice": "none", **NO_THINK}),
    Case("parameterless_tool", cc.call("get_time", {}), {"tools": [cc.TIME], **NO_THINK}),
    Case(
        "include_reasoning_false",
        "<think>\nsecret plan\n</think>\n\nThe answer is 4.",
        {"include_reasoning": False},
    ),
    Case("enable_thinking_false", "Direct answer without thinking.", NO_THINK),
    Case("stop_string_inside_content", "<think>\nok\n</think>\n\nThe answer is 4. STOP and more", {"stop": ["STOP"]}),
    Case(
        "truncated_inside_tool_call",
        cc.call("get_weather", {"city": "Paris, France, Europe"}),
        {"tools": [cc.WEATHER], "max_tokens": 12, **NO_THINK},
        stream_differs_from_batch="a cut-off tool call: batch returns the raw markup as content, the stream has streamed partial arguments",
    ),
]


@pytest.fixture(scope="module")
def batch_answers(server, vllm_server, tokenizer) -> dict[str, tuple[concurrent.futures.Future, concurrent.futures.Future]]:
    """Case name -> our batch answer and coupled chat's, every case's requests sent at once (one
    after another, they took about 30 s of a suite run). The streams are read one at a time in each
    test: a reader that keeps up is what lets their splits be compared."""
    scripts = {case.name: cc.script_for(tokenizer, case.text) for case in CASES}
    return sent_together({
        case.name: (
            functools.partial(_ours_batch, server, vllm_server, case, scripts[case.name]),
            functools.partial(cc.coupled_chat, vllm_server.url, cc.chat_body(**case.chat), scripts[case.name], stream=False),
        )
        for case in CASES
    })


def _ours_batch(server, vllm_server, case: Case, script: list[int]) -> dict[str, Any]:
    chat = cc.chat_body(**case.chat)
    r = post(server.url, cc.derender_request(vllm_server.url, chat, script))
    assert r.status_code == 200, r.text
    return r.json()


def _ours_stream(server, vllm_server, case: Case, script: list[int]) -> list[dict[str, Any]]:
    chat = cc.chat_body(**case.chat)
    events = sse_events(server.url, cc.derender_request(vllm_server.url, chat, script))
    assert events[-1] == "[DONE]"
    return events[:-1]


def _choice_deltas(events: list[dict[str, Any]], index: int = 0) -> list[dict[str, Any]]:
    return [c for e in events for c in e["choices"] if c["index"] == index]


def _without_tool_ids(delta: dict[str, Any]) -> dict[str, Any]:
    if "tool_calls" not in delta:
        return delta
    return {**delta, "tool_calls": [{k: v for k, v in tc.items() if k != "id"} for tc in delta["tool_calls"]]}


def _engine_split(deltas: list[dict[str, Any]]) -> list[list[int]] | None:
    """The tokens of each engine step a stream's chunks carried (the role chunk carries none);
    None where chunks hide them (hidden reasoning), so the split cannot be told."""
    steps = [c.get("token_ids") for c in deltas[1:]]
    return steps if all(steps) else None


def _split_free(message: dict[str, Any]) -> dict[str, Any]:
    """What of a folded stream no chunking changes: the text, and which calls (not their arguments)."""
    return {**cc.without_ids(message), "tool_calls": [tc["name"] for tc in cc.without_ids(message)["tool_calls"]]}


def _check_ids(message: dict[str, Any]) -> None:
    for tc in message["tool_calls"]:
        assert tc["id"].startswith("chatcmpl-tool-"), tc


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_derender_matches_coupled_chat(server, vllm_server, tokenizer, batch_answers, case: Case):
    script = cc.script_for(tokenizer, case.text)
    chat = cc.chat_body(**case.chat)

    ours_batch, theirs_batch = (answer.result() for answer in batch_answers[case.name])
    ours_choice, theirs_choice = ours_batch["choices"][0], theirs_batch["choices"][0]
    ChatMessage.model_validate(ours_choice["message"])  # vLLM's own model accepts our message
    assert ours_batch["output_mode"] == "derender"
    assert ours_choice["finish_reason"] == theirs_choice["finish_reason"]
    ours_msg, theirs_msg = cc.batch_message(ours_choice["message"]), cc.batch_message(theirs_choice["message"])
    assert cc.without_ids(ours_msg) == cc.without_ids(theirs_msg)
    assert ours_choice["message"].get("content") == theirs_choice["message"].get("content")
    assert set(ours_choice["message"]) == set(theirs_choice["message"]), "the same keys, nulls included"
    _check_ids(ours_msg)

    ours_events = _ours_stream(server, vllm_server, case, script)
    # return_token_ids: coupled chat then sends a chunk for every engine step, as the generate wire does
    # (`{}` for a step its parser held back), each with the step's tokens, so the two splits can be compared.
    theirs_events = cc.coupled_chat(vllm_server.url, {**chat, "return_token_ids": True}, script, stream=True)
    assert all(e["output_mode"] == "derender" for e in ours_events)
    ours_deltas = _choice_deltas(ours_events)
    theirs_deltas = [c for e in theirs_events for c in e.get("choices", [])]
    ours_acc = cc.accumulate([c["delta"] for c in ours_deltas])
    theirs_acc = cc.accumulate([c["delta"] for c in theirs_deltas])
    assert ours_deltas[0]["delta"] == theirs_deltas[0]["delta"] == {"role": "assistant", "content": ""}
    # Two real engines split the same tokens differently when a reader lags (vLLM merges the steps
    # it missed), and vLLM's streaming parse of a call cut mid-arguments depends on the split (CI:
    # `{}` against ``). What no split changes is always compared; the rest where the splits agree.
    # Split by split, the equality is proven over the scripted engine (tests/app/generate/test_derender.py, the
    # parser matrix), where the steps are the test's.
    assert _split_free(ours_acc) == _split_free(theirs_acc)
    if _engine_split(ours_deltas) is not None and _engine_split(ours_deltas) == _engine_split(theirs_deltas):
        assert cc.without_ids(ours_acc) == cc.without_ids(theirs_acc)
        # Chunk shape: each step's delta is coupled chat's, in order; not with a stop string, where
        # vLLM's text lags its token ids by the stop buffer and ours does not
        # (docs/vllm-differences.md#derender-stop-string-alignment).
        if "stop" not in chat:
            assert [_without_tool_ids(c["delta"]) for c in ours_deltas] == [_without_tool_ids(c["delta"]) for c in theirs_deltas]
    assert ours_deltas[-1]["finish_reason"] == [c for c in theirs_deltas if c.get("finish_reason")][-1]["finish_reason"]
    _check_ids(ours_acc)

    if case.stream_differs_from_batch is None:
        assert cc.without_ids(ours_acc) == cc.without_ids(ours_msg)


def test_a_stop_string_does_not_bend_the_streamed_tool_call(server, vllm_server, tokenizer):
    """The engine holds stop-buffer text back but not token ids; our parser sees them in step
    (decode_server/generate/pipeline/token_aligned_text.py, one id at a time), so a stop string that never matches leaves
    the streamed message as it is without one. vLLM 0.32's coupled chat streams tag text as
    content here (docs/vllm-differences.md); its batch message is the oracle for the call."""
    text = "<think>\nI should call the tool.\n</think>\n\n" + cc.call("get_weather", {"city": "Paris"})
    script = cc.script_for(tokenizer, text)
    plain = Case("plain", text, {"tools": [cc.WEATHER]})
    stopped = Case("stopped", text, {"tools": [cc.WEATHER], "stop": ["zzzz"]})
    reference = cc.without_ids(cc.accumulate([c["delta"] for c in _choice_deltas(_ours_stream(server, vllm_server, plain, script))]))
    for _ in range(2):
        events = _ours_stream(server, vllm_server, stopped, script)
        assert cc.without_ids(cc.accumulate([c["delta"] for c in _choice_deltas(events)])) == reference
    theirs = cc.coupled_chat(vllm_server.url, cc.chat_body(**stopped.chat), script, stream=False)["choices"][0]["message"]
    assert reference["tool_calls"] == cc.without_ids(cc.batch_message(theirs))["tool_calls"]
    assert reference["reasoning"] == theirs["reasoning"] and reference["content"] == "\n\n"


def test_stream_chunks_follow_engine_deltas_and_carry_token_ids(server, vllm_server, tokenizer):
    text = "<think>\nshort\n</think>\n\nHi!"
    script = cc.script_for(tokenizer, text)
    events = _ours_stream(server, vllm_server, Case("x", text), script)
    deltas = _choice_deltas(events)
    tokens = [t for c in deltas for t in c["token_ids"]]
    assert tokens == script + [151645]
    # After the role chunk, one chunk per engine step that reached the server: one token each at
    # stream interval 1 while the server keeps up. A real engine does not wait for its reader: on a
    # loaded machine vLLM's output collector hands a reader that fell behind the steps it missed as
    # one merged delta, so a chunk may carry several tokens, never none. The chunk shape step by step
    # is compared with vLLM's coupled chat in process (tests/app/vllm/test_parser_matrix.py), where the
    # scripted engine steps in lockstep with its readers.
    assert all(c["token_ids"] for c in deltas[1:]), deltas
    assert len(deltas) <= 1 + len(script) + 1


def test_n2_each_choice_has_its_own_parser(server, vllm_server, tokenizer):
    case = Case("n2", "<think>\nhmm\n</think>\n\n" + cc.call("get_weather", {"city": "Oslo"}), {"tools": [cc.WEATHER], "n": 2})
    script = cc.script_for(tokenizer, case.text)
    batch = _ours_batch(server, vllm_server, case, script)
    assert [c["index"] for c in batch["choices"]] == [0, 1]
    messages = [cc.without_ids(cc.batch_message(c["message"])) for c in batch["choices"]]
    assert messages[0] == messages[1]
    assert messages[0]["tool_calls"] == [{"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}]
    events = _ours_stream(server, vllm_server, case, script)
    for i in (0, 1):
        streamed = cc.without_ids(cc.accumulate([c["delta"] for c in _choice_deltas(events, i)]))
        assert streamed["tool_calls"] == messages[0]["tool_calls"]
        assert streamed["reasoning"] == messages[0]["reasoning"]


def test_include_reasoning_false_hides_reasoning_token_ids_and_logprobs(server, vllm_server, tokenizer):
    case = Case("hide", "<think>\nsecret\n</think>\n\nfour", {"include_reasoning": False, "logprobs": True, "top_logprobs": 2})
    script = cc.script_for(tokenizer, case.text)
    batch = _ours_batch(server, vllm_server, case, script)
    choice = batch["choices"][0]
    assert choice["message"].get("reasoning") is None and choice["logprobs"] is None and choice["token_ids"] is None
    deltas = _choice_deltas(_ours_stream(server, vllm_server, case, script))
    for c in deltas:
        assert "secret" not in json.dumps(c)
    # As coupled chat: no empty chunk per hidden reasoning step (they would tell its length).
    assert all(c["delta"] or c["finish_reason"] for c in deltas), deltas


# ---------------------------------------------------------------- the chat_request wire


def test_chat_request_wire_gives_the_same_message_as_parse_context(server, vllm_server, tokenizer):
    chat = cc.chat_body(tools=[cc.WEATHER])
    script = cc.script_for(tokenizer, "<think>\nx\n</think>\n\n" + cc.call("get_weather", {"city": "Rome"}))
    via_context = post(server.url, cc.derender_request(vllm_server.url, chat, script)).json()
    req = cc.derender_request(vllm_server.url, chat, script)
    req["chat_request"] = {**chat, "tool_choice": "auto"}
    del req["parse_context"]
    via_chat_request = post(server.url, req).json()
    a, b = (cc.without_ids(cc.batch_message(r["choices"][0]["message"])) for r in (via_context, via_chat_request))
    assert a == b and a["tool_calls"][0]["name"] == "get_weather"
