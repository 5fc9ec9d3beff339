"""Which registered parsers the matrix runs, and why the rest cannot run here, on both vLLM lines.

Read from vLLM's registries at test time, so a new vLLM's parsers show up and fail the
completeness check until placed: a registered parser is in a family row (families.ROWS), named
in SWEPT (it constructs on the demo vocabulary, and the sweep checks parity on generic text: not
judged yet, issue 33), or in LISTED with the error it gives on the demo vocabulary.
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
    # 0.33's BeamParser reads the tokenizer's response_template (its family row: qwen3_hf).
    ("tool", "beam"): "requires `response_template` metadata in the tokenizer configuration",
    ("reasoning", "beam"): "requires `response_template` metadata in the tokenizer configuration",
    **LISTED,
}


# The lines the matrix runs on (tests/vllm033 is 0.33's tier), and the names only the newer registers.
NEW_IN_033 = {(kind, name) for kind in ("tool", "reasoning") for name in ("beam", "muse", "musespark1x", "step5")}

# kind -> the registered names that run only in the generic sweep (parity on generic text, not
# judged against the family's format): issue 33's to-do list, shrinking as family rows land
# (docs/parsers.md's names table says which are left). Written out, not derived: a name a new vLLM
# registers is in no row until someone places it, and the completeness check says so.
SWEPT: dict[str, frozenset[str]] = {"tool": frozenset(), "reasoning": frozenset()}  # every name has a family row


def registered() -> tuple[list[str], list[str]]:
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    return sorted(ToolParserManager.list_registered()), sorted(ReasoningParserManager.list_registered())


def placed() -> set[tuple[str, str]]:
    """(kind, name) of every parser the matrix runs or lists with its reason, on either line."""
    rows = [*fm.ALL_ROWS, *fm.OPEN]  # an open row states its observed failure (families.OPEN)
    in_rows = {("tool", r.tool_parser) for r in rows} | {("reasoning", r.reasoning_parser) for r in rows}
    swept = {(kind, name) for kind, names in SWEPT.items() for name in names}
    return in_rows | swept | set(LISTED) | set(REFUSED_ON_THE_DEMO_VOCABULARY)


def unplaced(tools: list[str], reasonings: list[str]) -> list[tuple[str, str]]:
    """Registered names in no row, not swept, not listed: what the completeness check fails on."""
    names = [("tool", n) for n in tools] + [("reasoning", n) for n in reasonings]
    return [key for key in names if key not in placed()]


def stale(tools: list[str], reasonings: list[str], line: str) -> list[tuple[str, str]]:
    """Placed names this line does not register (only the newer line's own may be missing)."""
    names = {("tool", n) for n in tools} | {("reasoning", n) for n in reasonings}
    newer = NEW_IN_033 if line == "0.32" else set()
    return sorted(key for key in placed() - {("tool", None), ("reasoning", None)} if key not in names and key not in newer)


def _sweep() -> list[tuple[str | None, str | None]]:
    """The registered parsers SWEPT names, paired tool with reasoning so each pair of servers
    covers two parsers."""
    tools, reasonings = registered()
    t = [n for n in tools if n in SWEPT["tool"]]
    r = [n for n in reasonings if n in SWEPT["reasoning"]]
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
