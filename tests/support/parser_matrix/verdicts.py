"""Where vLLM's own stream and batch answers disagree: which one is right, and why.

We keep vLLM's answers (parity) and say here which a client should trust. A rule judges a whole
class of cases from the two answers (message, finish_reason); a case no rule covers is judged by
hand in BY_HAND.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.parser_matrix.verdicts_a import BY_HAND_A
from tests.support.parser_matrix.verdicts_b import BY_HAND_B

CUT_CASES = ("call_cut_by_length", "stop_string_inside_markup")

ESCAPING = (
    "equivalent: the same calls; the stream writes non-ASCII in the arguments as JSON escapes "
    "(`\\u00fc`), the batch as UTF-8 — the same JSON value"
)
FRAMING = (
    "batch is right: the stream also sends the whitespace between the reasoning and the calls as "
    "content; it is the format's framing, not text the model addressed to the user"
)
_CUT = (
    "the output ends inside a call (length, or a stop string inside it): the stream has already sent "
    "the call's name and part of its arguments, which a stream cannot take back; {batch}. A client "
    "must not run a call of a choice that finished with `length` or a stop string inside the call"
)
CUT_DROPPED = "batch is right: " + _CUT.format(batch="the batch answer claims no unfinished call")
CUT_EMPTY = "neither is a call to run: " + _CUT.format(batch="the batch answer keeps the call with `{}` arguments")
CUT_MARKUP = "neither is a call to run: " + _CUT.format(batch="the batch answer gives the cut markup back as content")
HELD_BACK = (
    "batch is right: the output ends inside the call's markup, before any call could be parsed; the "
    "stream holds that text back waiting for the call and never sends it, the batch answer returns it "
    "as the content it is"
)

AFTER_CALLS = (
    "stream is right: the model wrote ` Done.` after the call; vLLM's batch parser drops the text "
    "that follows the calls"
)
FOREIGN = (
    "not judged: the sweep feeds a parser generic text (`<think>`, a hermes call, bare JSON), not its "
    "family's format, so neither answer is what that family's model would get; only parity is claimed"
)
_LLAMA = {
    "content_around_calls": (
        "batch is right about the call: the model wrote text, `<|python_tag|>` and a JSON call; the "
        "streaming parser takes a call only at the start of the output, so the stream sends the call "
        "as content (the batch answer in turn drops the text around the call)"
    ),
    "call_cut_by_length": (
        "batch is right: the output is cut inside the JSON; the stream holds the partial JSON back "
        "waiting for a call and never sends it, the batch answer returns it as the content it is"
    ),
    "stop_string_inside_markup": (
        "batch is right: the stop string cuts the JSON, so there is no call; the stream has already "
        "sent a call with partial arguments, the batch answer returns the text as content"
    ),
}
_GLM_PLAIN_TEXT = (
    "stream is right: the model wrote this text without `<think>` (the prompt did not open "
    "reasoning); vLLM's batch reasoning parser (glm45, glm47, ling3) files text with no `</think>` as "
    "reasoning, its streaming parser as content{after}"
)
_HERMES_CUT = (
    "neither is a call to run: the output ends inside `<tool_call>`; the stream has sent a call "
    "with {stream} arguments, the batch answer gives the cut markup back as content. A client must "
    "not run a call of a choice that finished with `length` or a stop string inside the call"
)

_OLMO3_NO_THINK = (
    "batch is right: the model wrote no think block here; vLLM's streaming olmo3 reasoning parser sends "
    "everything as reasoning until a `</think>` comes (and then never reaches the tool parser), its batch "
    "parser reads output without `</think>` as the answer"
)

_STRIPPED_AND_JOINED = (
    "stream is right: it gives the text around the call as the model wrote it (` Done.` after it); "
    "vLLM's batch parser strips the text on both sides of the call and joins it with a newline"
)

# Ling3's parser is GLM-4.7's (vllm/parser/ling3.py), with the same answers.
_GLM_ROWS = ("glm45:glm45+glm45", "glm45:glm47+glm47", "glm45:ling3+ling3")

# Rows whose tool parser vLLM runs engine-based, judged on tool_choice=required's forced JSON list.
ENGINE_REQUIRED = ("seed_oss:seed_oss+seed_oss", "granite:granite+-")

# (row id, case) -> verdict, for cases no rule above covers.
BY_HAND: dict[tuple[str, str], str] = {
    **{(f"llama3:{tool}+-", case): why for tool in ("llama3_json", "llama4_json") for case, why in _LLAMA.items()},
    **{
        (row, "content_around_calls"): _GLM_PLAIN_TEXT.format(after=", and drops ` Done.` after the call")
        for row in _GLM_ROWS
    },
    **{(row, "tool_choice_none"): _GLM_PLAIN_TEXT.format(after="") for row in _GLM_ROWS},
    # qwen3_json is vLLM's alias of hermes (the same class): the same cases, the same verdicts.
    **{(f"qwen3:{tool}+qwen3", "call_cut_by_length"): _HERMES_CUT.format(stream="`{}`") for tool in ("hermes", "qwen3_json")},
    **{(f"qwen3:{tool}+qwen3", "stop_string_inside_markup"): _HERMES_CUT.format(stream="partial") for tool in ("hermes", "qwen3_json")},
    ("mistral:mistral+mistral", "content_around_calls"): (
        "batch is right: the arguments are the JSON object; vLLM's streaming mistral parser appends "
        "the text after it (` Done.`) to the call's arguments, which are then not valid JSON"
    ),
    ("deepseek_v3:deepseek_v31+deepseek_v3", "content_around_calls"): (
        "stream is right: the model wrote ` Done.` after the calls; vLLM's batch parser keeps only the "
        "text before `<｜tool▁calls▁begin｜>` and drops what follows `<｜tool▁calls▁end｜>`"
    ),
    ("jamba:jamba+-", "reasoning_then_two_calls"): (
        "batch is right: the call list is complete JSON in the script; vLLM's streaming jamba parser "
        "never sends the last call's closing `\"` and `}`, so the streamed arguments are not valid JSON"
    ),
    **{(row, "content_around_calls"): _STRIPPED_AND_JOINED for row in ("lfm2:lfm2+-", "apertus:apertus+-")},
    ("apertus:apertus+-", "stop_string_inside_markup"): (
        "neither is a call to run: the stop string cuts the call's arguments; the stream sent the call with "
        "partial arguments, the batch answer closes the cut JSON (vLLM's partial-JSON fallback) into a value "
        "the model never wrote. A client must not run a call of a choice that finished with a stop string "
        "inside the call"
    ),
    ("k2_horizon:k2_horizon+k2_horizon", "tool_choice_none"): (
        "batch is right: the model wrote no think block, so the text is the answer (vLLM's batch parser "
        "reads output without `</ifm|think>` or a call as content); the streaming parser sends it as "
        "reasoning while no end marker has come, and never moves it"
    ),
    **{("qwen3:olmo3+olmo3", case): _OLMO3_NO_THINK for case in ("content_around_calls", "call_cut_by_length", "tool_choice_none", "thinking_off_then_call")},
    **{
        ("qwen3:olmo3+olmo3", case): (
            "batch is right: guided decoding made the model write the forced JSON after its reasoning, and vLLM's "
            "batch answer reads the call{s} from it; its stream sends that JSON as content and no call (the text "
            "after `</think>` never reaches the tool-call path there)"
        ).format(s="s" if case == "tool_choice_required" else "")
        for case in ("tool_choice_required", "tool_choice_named")
    },
    **{
        (row, "tool_choice_required"): (
            "batch is right: guided decoding made the model write the forced JSON list, and vLLM's batch answer "
            "reads both calls; its stream sends no call: with an engine-based tool parser vLLM's composed parser "
            "hands each step's text alone, not the text so far, to the required-list scanner, which never sees "
            "a whole list element"
        )
        for row in ENGINE_REQUIRED
    },
    ("qwen3:olmo3+olmo3", "reasoning_then_two_calls"): (
        "batch is right: the model wrote the calls after its reasoning; vLLM's streaming olmo3 tool parser "
        "takes calls only when the text starts with `<`, and the text after `</think>` starts with a blank "
        "line, so the stream sends the calls as content (and drops the final `>`)"
    ),
    **{
        ("qwen3:phi4_mini_json+-", case): (
            "batch is right: vLLM's phi4_mini_json parser has no streaming extraction (it returns no delta), "
            "so its stream sends nothing of the calls the model wrote"
        )
        for case in ("reasoning_then_two_calls", "content_around_calls", "thinking_off_then_call")
    },
    **{
        ("kimi_k3:kimi_k3+kimi_k3", case): (
            "batch is right: the model wrote no think channel, so the response channel is the answer and the "
            "tools channel its calls; vLLM's streaming kimi_k3 reasoning parser sends everything, markers "
            "included, as reasoning while no `<|close|>think<|sep|>` has come, and never moves it"
        )
        for case in ("content_around_calls", "tool_choice_none")
    },
    ("granite:-+granite", "reasoning_then_content"): (
        "batch is right: the model wrote `Here is my thought process:` to open its thought; vLLM's streaming "
        "granite reasoning parser keeps that marker's final `:` at the start of the reasoning"
    ),
    ("granite:granite-20b-fc+-", "content_around_calls"): (
        "batch is right: the model wrote text, then a call; vLLM's streaming granite-20b-fc parser takes "
        "calls only when the output starts with `<function_call>`, so the stream sends the call as content"
    ),
    **{
        (row, "stop_string_inside_markup"): (
            "neither is a call to run: the stop string cuts the call's arguments; the stream sent the call with "
            "partial arguments and the cut call's opening markup ({markup}) as content, the batch answer keeps "
            "the call with `{{}}` arguments. A client must not run a call of a choice that finished with a stop "
            "string inside the call"
        ).format(markup=markup)
        for row, markup in (
            ("qwen3:qwen3_coder+granite_thinking_parser", "`<tool_call>\\n`"),
            ("qwen3:qwen3_coder+nemotron_v3", "`\\n\\n<too`"),
        )
    },
    ("ernie45:ernie45+ernie45", "reasoning_then_content"): (
        "batch is right: the model answered in a `<response>` block; vLLM's batch ernie45 reasoning parser takes "
        "the answer out of it, while its stream (once the thought has ended the composed parser no longer asks "
        "the reasoning parser) sends the block's tags and the blank line before it as content"
    ),
    ("ernie45:ernie45+ernie45", "tool_choice_none"): (
        "neither: the model wrote no `</think>`, so vLLM's ernie45 parser reads the whole answer as reasoning "
        "(the model always thinks first); the stream drops the `<response>` tags (its streaming parser skips "
        "each tag's token), the batch keeps them"
    ),
    **BY_HAND_B,
    **BY_HAND_A,
}


def _parsed_calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    calls = []
    for tc in message.get("tool_calls") or []:
        try:
            arguments = json.loads(tc.get("arguments") or "null")
        except json.JSONDecodeError:
            arguments = tc.get("arguments")
        calls.append((tc.get("name"), arguments))
    return calls


def _text(message: dict[str, Any], key: str) -> str:
    return message.get(key) or ""


def verdict(row: str, case: str, folded: dict[str, Any], batch: dict[str, Any]) -> str | None:
    """Which of the folded stream and the batch answer is right, or None when not judged yet."""
    if (row, case) in BY_HAND:
        return BY_HAND[(row, case)]
    if row.startswith("demo:"):
        return FOREIGN
    same_calls = _parsed_calls(folded) == _parsed_calls(batch)
    same_reasoning = _text(folded, "reasoning") == _text(batch, "reasoning")
    if same_calls and same_reasoning and _text(folded, "content") == _text(batch, "content"):
        return ESCAPING
    if same_calls and same_reasoning and not _text(folded, "content").strip() and not _text(batch, "content"):
        return FRAMING
    content, kept_content = _text(folded, "content"), _text(batch, "content")
    if same_calls and same_reasoning and content != kept_content and content.replace("Done.", "").strip() == kept_content.strip():
        return AFTER_CALLS
    # The batch answer kept what the stream sent as content, then the cut markup.
    cut_markup = kept_content.startswith(content) and kept_content[len(content) :].strip()
    if case in CUT_CASES and same_reasoning and not _parsed_calls(batch) and cut_markup:
        return CUT_MARKUP if _parsed_calls(folded) else HELD_BACK
    if case in CUT_CASES and same_reasoning and _text(folded, "content").strip() == _text(batch, "content").strip():
        cut, kept = _parsed_calls(folded), _parsed_calls(batch)
        if len(kept) < len(cut):
            return CUT_DROPPED
        if [n for n, _ in kept] == [n for n, _ in cut] and kept[-1][1] == {}:
            return CUT_EMPTY
    return None


# finish_reason. vLLM's batch answer says `tool_calls` whenever its parser returned a call under
# auto tool choice, whatever the engine's reason, and for tool_choice=required whenever the engine
# stopped; its stream says `tool_calls` only when it streamed a call and the engine stopped.
_LENGTH_CUT = (
    "stream is right (`length`): the engine stopped at max_tokens inside the call, so the call is not "
    "complete; vLLM's batch answer says `tool_calls` because its parser returned a call, whatever the "
    "engine's reason{truncated}. A client that runs the calls of a `tool_calls` choice would run an "
    "unfinished call"
)
_TRUNCATED = ", here with cut-off JSON arguments (`{arguments}`)"
FINISH_FOLLOWS_MESSAGE = (
    "each finish_reason matches its own message (`tool_calls` exactly where that message has a call), "
    "so the right one is that of the message judged right above"
)
FINISH_REQUIRED = (
    "stream is right (`stop`): no call was parsed (neither message has one), yet with "
    "tool_choice=required vLLM's batch answer says `tool_calls` whenever the engine stopped; a client "
    "told `tool_calls` finds no call to run"
)


def _cut_arguments(message: dict[str, Any]) -> str | None:
    """The last call's arguments when they are not complete JSON."""
    calls = message.get("tool_calls") or []
    if not calls:
        return None
    try:
        json.loads(calls[-1].get("arguments") or "{}")
    except json.JSONDecodeError:
        return calls[-1]["arguments"]
    return None


def finish_verdict(
    row: str, case: str, stream: str | None, batch: str | None, folded: dict[str, Any], batch_message: dict[str, Any]
) -> str | None:
    """Which of the stream's and the batch's finish_reason is right, or None when not judged yet."""
    if row.startswith("demo:"):
        return FOREIGN
    if (stream, batch) == ("length", "tool_calls"):
        arguments = _cut_arguments(batch_message)
        return _LENGTH_CUT.format(truncated=_TRUNCATED.format(arguments=arguments) if arguments is not None else "")
    no_calls = not folded.get("tool_calls") and not batch_message.get("tool_calls")
    if case == "tool_choice_required" and (stream, batch) == ("stop", "tool_calls") and no_calls:
        return FINISH_REQUIRED
    says_calls = {"tool_calls": True, "stop": False}
    if says_calls.get(stream) == bool(folded.get("tool_calls")) and says_calls.get(batch) == bool(batch_message.get("tool_calls")):
        return FINISH_FOLLOWS_MESSAGE
    return None
