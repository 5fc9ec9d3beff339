"""Which registered parsers the matrix runs, and why the rest cannot run here.

Read from vLLM's registries at test time, so a new vLLM's parsers show up: a registered parser is
in a family row (families.ROWS), in the generic sweep (it constructs on the demo vocabulary, and
the sweep checks parity on generic text), or in LISTED with the error it gives on the demo vocabulary.
"""

from __future__ import annotations

import json

from tests.support import chat_cases as cc
from tests.support.parser_matrix import families as fm

# (kind, name) -> the message vLLM's construction gives on the demo vocabulary (asserted): registered
# parsers that no family tokenizer here makes real. None today; a new vLLM's parser lands here first.
LISTED: dict[tuple[str, str], str] = {}

# (kind, name) -> vLLM's reason on a vocabulary without the family's tokens (the demo model's): what
# `serve` says at start-up, before an engine, when the served model is not that parser's family.
REFUSED_ON_THE_DEMO_VOCABULARY: dict[tuple[str, str], str] = {
    ("tool", "hy_v3"): "could not locate tool call start/end tokens",
    ("tool", "hy_v4"): "could not locate tool call start/end tokens",
    ("tool", "jamba"): "could not locate tool calls start/end tokens",
    ("tool", "lfm2"): "could not locate <|tool_call_start|>/<|tool_call_end|> tokens",
    ("reasoning", "k2_horizon"): "could not locate think start/end tokens",
    ("reasoning", "minimax_m3"): "could not locate think start/end tokens",
    ("reasoning", "poolside_v1"): "Tokenizer must contain '<assistant>' token",
    **LISTED,
}


def registered() -> tuple[list[str], list[str]]:
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    return sorted(ToolParserManager.list_registered()), sorted(ReasoningParserManager.list_registered())


def _sweep() -> list[tuple[str | None, str | None]]:
    """The registered parsers no family row runs and LISTED does not name, paired tool with
    reasoning so each pair of servers covers two parsers."""
    tools, reasonings = registered()
    rows = [*fm.ROWS, *fm.OPEN]
    in_rows = {r.tool_parser for r in rows}, {r.reasoning_parser for r in rows}
    t = [n for n in tools if n not in in_rows[0] and ("tool", n) not in LISTED]
    r = [n for n in reasonings if n not in in_rows[1] and ("reasoning", n) not in LISTED]
    width = max(len(t), len(r))
    return [(t[i] if i < len(t) else None, r[i] if i < len(r) else None) for i in range(width)]


SWEEP = _sweep()


def sweep_cases(tools: bool) -> list[fm.Case]:
    """One script: <think> reasoning, content, a hermes call and a bare JSON call (generic text,
    not any one family's format: it proves parity, not that the family's calls are parsed)."""
    text = "<think>\nplan ✓\n</think>\n\nIt is sunny."
    if tools:
        text += " Checking. " + cc.call("get_weather", fm.WEATHER_ARGS) + "\n" + json.dumps({"name": "search", "arguments": fm.SEARCH_ARGS})
    return [fm.Case("generic", text, {"tools": fm.TOOLS} if tools else {})]
