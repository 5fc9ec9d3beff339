"""Where vLLM's own stream and batch answers disagree: which one is right, and why.

We keep vLLM's answers (parity) and say here which a client should trust. A rule judges a whole
class of cases from the two messages; a case no rule covers is judged by hand in BY_HAND.
"""

from __future__ import annotations

import json
from typing import Any

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

# (row id, case) -> verdict, for cases no rule above covers.
BY_HAND: dict[tuple[str, str], str] = {
    ("deepseek_v3:deepseek_v31+deepseek_v3", "content_around_calls"): (
        "stream is right: the model wrote ` Done.` after the calls; vLLM's batch parser keeps only the "
        "text before `<｜tool▁calls▁begin｜>` and drops what follows `<｜tool▁calls▁end｜>`"
    ),
    ("deepseek_v3:deepseek_v31+deepseek_v3", "reasoning_then_two_calls"): (
        "batch is right: the arguments are complete JSON in the script; vLLM's streaming parser for "
        "the V3.1 format withholds each call's last characters (the end of `東京\"}`) and never sends them"
    ),
    ("deepseek_v3:deepseek_v3+deepseek_r1", "stop_string_inside_markup"): (
        "batch is right: the stop string ends the output inside the call, so there is no call; the "
        "stream has also sent `<think>` as reasoning text, though the prompt already opened reasoning"
    ),
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
    same_calls = _parsed_calls(folded) == _parsed_calls(batch)
    same_reasoning = _text(folded, "reasoning") == _text(batch, "reasoning")
    if same_calls and same_reasoning and _text(folded, "content") == _text(batch, "content"):
        return ESCAPING
    if same_calls and same_reasoning and not _text(folded, "content").strip() and not _text(batch, "content"):
        return FRAMING
    if case in CUT_CASES and same_reasoning and _text(folded, "content").strip() == _text(batch, "content").strip():
        cut, kept = _parsed_calls(folded), _parsed_calls(batch)
        if len(kept) < len(cut):
            return CUT_DROPPED
        if [n for n, _ in kept] == [n for n, _ in cut] and kept[-1][1] == {}:
            return CUT_EMPTY
    return None
