"""The chat request a derender plan hands vLLM's parsers: built as vLLM 0.33's
`ParseContext.to_chat_request` builds it (`model_construct`, no validators), with the request's
default factories called by us rather than by pydantic (whose check of each factory's signature
cost ~0.3 ms per request). It must be the request pydantic's own construction gives."""

from __future__ import annotations

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

from decode_server.generate.pipeline.derender_plan import _chat_request_from_parse_context

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
RAW = {"tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": False, "include_reasoning": False,
       "chat_template_kwargs": {"enable_thinking": True}}


def by_pydantic(ours: ChatCompletionRequest) -> ChatCompletionRequest:
    """The same fields, every default (factories included) left to pydantic."""
    return ChatCompletionRequest.model_construct(**{name: getattr(ours, name) for name in ours.model_fields_set})


def test_the_parsers_request_is_what_model_construct_alone_gives():
    ours = _chat_request_from_parse_context(RAW)
    theirs = by_pydantic(ours)
    assert ours.model_fields_set == theirs.model_fields_set == {
        "messages", "tools", "tool_choice", "parallel_tool_calls", "include_reasoning", "chat_template_kwargs"}
    mine, pydantics = ours.model_dump(), theirs.model_dump()
    assert mine.pop("request_id") != pydantics.pop("request_id")  # a fresh one each, as pydantic's factory makes
    assert mine == pydantics
    assert ours.tool_choice == "auto" and ours.include_reasoning is False and ours.tools[0].function.name == "get_weather"


def test_no_two_requests_share_a_default_factorys_value():
    a, b = _chat_request_from_parse_context({}), _chat_request_from_parse_context({})
    assert a.request_id != b.request_id
    assert a.bad_words == [] and a.bad_words is not b.bad_words
    assert a.tool_choice == "none"  # no tool_choice in the context: "none", as vLLM 0.33
