"""Requests about what 0.33 changed in the generate wire that the shared corpus (written against
0.32) does not send: parse_context checked at every level, 0.33's batch derender (its message
assembly, `include_reasoning=false`, chat's top_logprobs limit), top_logprobs with the sampled
token outside the top k. Sent to ours and to 0.33's server beside the corpus (tests/app/vllm/test_differential.py on 0.33)."""

from __future__ import annotations

from tests.support.differential_corpus import SP, Case

_CTX = {"tools": None, "tool_choice": "none", "include_reasoning": True}
_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]

CASES_033: list[Case] = [
    # 0.33's GenerateRequest types parse_context: its errors are 400s at every level ...
    SP("v033_parse_context_wrong_type_at_tokens", {}, parse_context={"tools": "x"}),
    SP("v033_parse_context_not_an_object_at_text", {}, output_mode="text", parse_context=[1]),
    SP("v033_parse_context_negative_history_at_tokens", {}, parse_context={"history_tool_call_cnt": -1}),
    SP("v033_parse_context_include_reasoning_string_stream", {}, stream=True,
       parse_context={"include_reasoning": "maybe"}),
    # ... its unknown keys only at derender (else a logged warning).
    SP("v033_parse_context_unknown_key_at_tokens", {}, parse_context={"bogus": 1}),
    SP("v033_parse_context_unknown_key_at_derender", {}, output_mode="derender", parse_context={**_CTX, "bogus": 1},
       message="Unknown parse_context fields"),
    SP("v033_parse_context_unknown_named_tool", {}, output_mode="derender",
       parse_context={**_CTX, "tools": _TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
    SP("v033_parse_context_history_count", {}, output_mode="derender", parse_context={**_CTX, "history_tool_call_cnt": 3}),
    # Batch derender is 0.33's OnlineDerenderer: chat's top_logprobs limit, metadata hidden with reasoning.
    SP("v033_derender_logprobs_2", {"logprobs": 2}, output_mode="derender", parse_context=_CTX),
    SP("v033_derender_logprobs_0", {"logprobs": 0}, output_mode="derender", parse_context=_CTX),
    SP("v033_derender_logprob_token_ids", {"logprobs": 2, "logprob_token_ids": [11, 1879]}, output_mode="derender",
       parse_context=_CTX),
    SP("v033_derender_reasoning_hidden", {"logprobs": 2}, output_mode="derender", return_token_ids=True,
       parse_context={**_CTX, "include_reasoning": False}),
    SP("v033_derender_n_2", {"n": 2, "logprobs": 1}, output_mode="derender", parse_context=_CTX),
    SP("v033_derender_forced_tool", {}, output_mode="derender",
       parse_context={**_CTX, "tools": _TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    # tokens/text: every candidate (the sampled one outside the top k gives k + 1).
    SP("v033_logprobs_1", {"logprobs": 1}),
    SP("v033_text_logprobs_1_stream", {"logprobs": 1}, output_mode="text", stream=True),
]
