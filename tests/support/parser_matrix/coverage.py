"""Which registered parsers the matrix runs, and why the rest cannot run here, on both vLLM lines.

Read from vLLM's registries at test time, so a new vLLM's parsers show up and fail the
completeness check until placed: a registered parser is in a family row (families.ROWS), judged
against coupled chat in its family's own format, or in LISTED with the error it gives on the demo
vocabulary. (The generic sweep, parity on generic text without a verdict, retired once every name
had a family row.)
"""

from __future__ import annotations

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



def registered() -> tuple[list[str], list[str]]:
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    return sorted(ToolParserManager.list_registered()), sorted(ReasoningParserManager.list_registered())


def placed() -> set[tuple[str, str]]:
    """(kind, name) of every parser the matrix runs or lists with its reason, on either line."""
    rows = [*fm.ALL_ROWS, *fm.OPEN]  # an open row states its observed failure (families.OPEN)
    in_rows = {("tool", r.tool_parser) for r in rows} | {("reasoning", r.reasoning_parser) for r in rows}
    return in_rows | set(LISTED) | set(REFUSED_ON_THE_DEMO_VOCABULARY)


def unplaced(tools: list[str], reasonings: list[str]) -> list[tuple[str, str]]:
    """Registered names in no row and not listed: what the completeness check fails on."""
    names = [("tool", n) for n in tools] + [("reasoning", n) for n in reasonings]
    return [key for key in names if key not in placed()]


def stale(tools: list[str], reasonings: list[str], line: str) -> list[tuple[str, str]]:
    """Placed names this line does not register (only the newer line's own may be missing)."""
    names = {("tool", n) for n in tools} | {("reasoning", n) for n in reasonings}
    newer = NEW_IN_033 if line == "0.32" else set()
    return sorted(key for key in placed() - {("tool", None), ("reasoning", None)} if key not in names and key not in newer)
