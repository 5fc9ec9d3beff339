"""Several parser deltas (wire form) as one: what one engine step's per-id pieces produced.

The derender stage feeds a parser one id at a time (token_text_ends.py) but sends one event per
engine step, so a client still gets one chunk per step. The merged delta folds to what the
pieces' deltas fold to, as clients fold a stream: strings concatenated, tool calls by index (id
and type from the first piece that sets them, name and arguments concatenated).
"""

from __future__ import annotations

from typing import Any

_TEXT_FIELDS = ("role", "content", "reasoning")


def merge_deltas(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        for key in _TEXT_FIELDS:
            if key in delta:
                value, before = delta[key], out.get(key)
                # A field a parser set to None is written as null, as one delta would write it.
                out[key] = before if value is None else value if before is None else before + value
        for call in delta.get("tool_calls", ()):
            into = calls.get(call.get("index"))
            if into is None:
                calls[call.get("index")] = into = dict(call)
                if call.get("function") is not None:
                    into["function"] = dict(call["function"])
                continue
            _merge_call(into, call)
    if calls:
        out["tool_calls"] = list(calls.values())
    return out


def _merge_call(into: dict[str, Any], call: dict[str, Any]) -> None:
    for key in ("id", "type"):
        if into.get(key) is None and call.get(key) is not None:
            into[key] = call[key]
    fn = call.get("function")
    if fn is None:
        return
    have = into.get("function")
    if have is None:
        into["function"] = dict(fn)
        return
    for key in ("name", "arguments"):
        if fn.get(key) is not None:
            have[key] = fn[key] if have.get(key) is None else have[key] + fn[key]
