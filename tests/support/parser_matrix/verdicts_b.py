"""By-hand verdicts for the rows of tests/support/parser_matrix/formats_b.py's families, where vLLM's
own stream and batch disagree (merged into verdicts.BY_HAND)."""

from __future__ import annotations

_A13B = "hunyuan_a13b:hunyuan_a13b+hunyuan_a13b"
# vLLM's streaming hunyuan_a13b reasoning parser switches state only on Hunyuan's exact id sequences
# (`\n` `</` `think` ... and `\n` `</` `answer` `>`); the model writes `.` and `\n` as one token `.\n`
# (Hunyuan's BPE merges them), so those sequences do not come whole.
_A13B_FRAMING = (
    "batch is right: the model ended its {what} with `.\\n` (one token in Hunyuan's BPE), so the id sequence "
    "vLLM's streaming hunyuan_a13b reasoning parser waits for (`\\n` `</` `{tag}` ...) never comes: the stream "
    "{kept}; the batch parser's regexes read the text and strip it"
)
_A13B_THOUGHT = _A13B_FRAMING.format(
    what="thought and its answer",
    tag="think",
    kept="ends the thought on the fast-think form (without `\\n`) and keeps the `\\n` in the reasoning, and sends "
    "the answer's closing `\\n</answer>` as content",
)
_A13B_ANSWER = _A13B_FRAMING.format(what="answer", tag="answer", kept="sends the answer's closing `\\n</answer>` as content")
_A13B_TAG = (
    "batch is right: the model wrote its calls in `<tool_calls>`; vLLM's streaming hunyuan_a13b tool parser sends "
    "the text as content until a `[` follows the tag, so the tag itself went out as content{also}"
)

BY_HAND_B: dict[tuple[str, str], str] = {
    (_A13B, "reasoning_then_content"): _A13B_THOUGHT,
    (_A13B, "tool_choice_none"): _A13B_ANSWER,
    (_A13B, "reasoning_then_two_calls"): _A13B_TAG.format(
        also=" (and, as in reasoning_then_content, the thought's `\\n` stays in the streamed reasoning)"
    ),
    (_A13B, "thinking_off_then_call"): _A13B_TAG.format(also=""),
    (_A13B, "content_around_calls"): (
        "batch is right: the model wrote text, then its calls; vLLM's streaming hunyuan_a13b tool parser takes calls "
        "only when the answer starts with `<tool_calls>`, so the stream sends the calls (and `</answer>`) as content"
    ),
    (_A13B, "stop_string_inside_markup"): (
        "neither is a call to run: the stop string cuts the call's arguments; the stream sent the call with empty "
        "arguments (and `<tool_calls>` as content, the thought's `\\n` in the reasoning), the batch answer gives the "
        "cut markup back as content. A client must not run a call of a choice that finished with a stop string "
        "inside the call"
    ),
    (_A13B, "tool_choice_required"): (
        "neither gives the call: vLLM's engine never applied the required list's grammar (families.Row."
        "grammar_never_applied), so the model wrote its markup, which vLLM reads as the forced JSON list and drops "
        "whole (no call, no content); the stream also keeps the thought's `\\n` in the reasoning (as in "
        "reasoning_then_content)"
    ),
    (_A13B, "tool_choice_named"): (
        "neither is a call to run: vLLM's engine never applied the named tool's grammar (families.Row."
        "grammar_never_applied), so the model wrote its markup, not the arguments' JSON; both take the markup as the "
        "arguments, the stream with the "
        "answer's closing `\\n</answer>` (its reasoning parser did not strip it, as in tool_choice_none)"
    ),
}
