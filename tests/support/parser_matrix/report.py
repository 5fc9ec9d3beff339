"""What the matrix run found, written as docs/parsers.md when PARSER_MATRIX_DOC names a file.

`passed` marks a row's configuration proven; `record` notes a case whose folded stream differs
from its batch answer in vLLM's own chat too (parity kept). The table is generated, never edited.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.support.chat_cases import without_ids
from tests.support.parser_matrix.coverage import NEW_IN_033, REFUSED_ON_THE_DEMO_VOCABULARY
from tests.support.parser_matrix.families import ALL_ROWS, LINE, OPEN
from tests.support.parser_matrix.verdicts import finish_verdict, verdict

PASSED: dict[str, set[str]] = {}
Answer = tuple[dict[str, Any], str | None]  # (message, finish_reason)
RECORDED: dict[tuple[str, str], tuple[Answer, Answer]] = {}
COMPOSED: dict[str, str] = {}
REFUSED: dict[tuple[str, str], str] = {}


LOST_CALLS: dict[tuple[str, str], str] = {}
# (row, case) -> why our stream differs from vLLM's there on purpose (a docs/vllm-differences.md link):
# its deltas are not compared one by one, its finish_reason and our own stream == batch still are.
ON_PURPOSE: dict[tuple[str, str], str] = {}


# (row, case, "batch" or "stream") -> (status, vLLM's message): where vLLM's own parser raised on the
# family's output; coupled chat answers an error there, and so do we (asserted).
PARSER_ERRORS: dict[tuple[str, str, str], tuple[int, str]] = {}


def parser_error(row: str, case: str, part: str, status: int, message: str) -> None:
    PARSER_ERRORS[(row, case, part)] = (status, message)


# (row, case) -> whether vLLM's render forced JSON for that required/named tool_choice (else the family's markup).
FORCED: dict[tuple[str, str], bool] = {}


def forced(row: str, case: str, json_schema: bool) -> None:
    FORCED[(row, case)] = json_schema


# (row, case) -> why vLLM's parser reads no call from the JSON its render forced (families.Row.forced_json_unread).
UNREAD: dict[tuple[str, str], str] = {}


def unread(row: str, case: str, why: str) -> None:
    UNREAD[(row, case)] = why


# (row, case) -> why vLLM's engine never applies the grammar its render installs (Row.grammar_never_applied).
NEVER_APPLIED: dict[tuple[str, str], str] = {}


def never_applied(row: str, case: str, why: str) -> None:
    NEVER_APPLIED[(row, case)] = why


def on_purpose(row: str, case: str, why: str) -> None:
    ON_PURPOSE[(row, case)] = why


def lost_call(row: str, case: str, why: str) -> None:
    LOST_CALLS[(row, case)] = why


def refused(row: str, case: str, message: str) -> None:
    REFUSED[(row, case)] = message


def composed(row: str, parser_cls: type) -> None:
    """The parser class vLLM composed for the row (ParserManager's base: DelegatingParser,
    HarmonyParser, ...): which of its composition paths the row proves."""
    composed_here = "<locals>" in parser_cls.__qualname__  # a subclass ParserManager made for the flags
    COMPOSED[row] = (parser_cls.__mro__[1] if composed_here else parser_cls).__name__


def passed(row: str, what: str) -> None:
    PASSED.setdefault(row, set()).add(what)


def record(row: str, case: str, stream: Answer, batch: Answer) -> list[str]:
    """Notes the case; returns the parts (message, finish_reason) that differ with no verdict."""
    RECORDED[(row, case)] = (stream, batch)
    return [part for part, judged in _verdicts(row, case, stream, batch).items() if judged is None]


def _verdicts(row: str, case: str, stream: Answer, batch: Answer) -> dict[str, str | None]:
    """A verdict for each part that differs (None where none is written yet)."""
    (folded, stream_finish), (batch_message, batch_finish) = stream, batch
    out: dict[str, str | None] = {}
    if without_ids(folded) != without_ids(batch_message):
        out["message"] = verdict(row, case, folded, batch_message)
    if stream_finish != batch_finish:
        out["finish_reason"] = finish_verdict(row, case, stream_finish, batch_finish, folded, batch_message)
    return out


def _cell(row: str, what: str) -> str:
    return "✓" if what in PASSED.get(row, ()) else "not run"


def _stream_cell(row: str) -> str:
    """✓, or ✓ but for the cases where ours differs from vLLM's stream on purpose, with the reason."""
    cases = sorted({(case, why) for (r, case), why in ON_PURPOSE.items() if r == row})
    if not cases:
        return "✓"
    return "✓ but " + ", ".join(f"`{case}` ([on purpose](vllm-differences.md#{why.split('#')[-1]}))" for case, why in cases)


def _agreement_cell(row: str) -> str:
    """✓, or the cases where vLLM's own stream and batch disagree too (parity kept; judged below)."""
    cases = sorted(case for (r, case) in RECORDED if r == row)
    if not cases:
        return "✓"
    return "≠ in " + ", ".join(f"`{c}`" for c in cases) + " (vLLM's own too; judged below)"


def render(rows: list[Any], open_rows: dict[Any, str], listed: dict[tuple[str, str], str]) -> str:
    out = [
        "# Parsers: derender against vLLM's coupled chat",
        "",
        "Generated by `PARSER_MATRIX_DOC=docs/parsers.md pytest tests/app/vllm/test_parser_matrix.py` (do not edit).",
        "Each ✓: for every case of the row, our derender (batch and stream) equals vLLM's `/v1/chat/completions`",
        "on the same engine outputs — messages, every streamed delta in order (tool-call ids by shape),",
        "finish_reason — and our folded stream equals our batch answer (message and finish_reason), except in the cases listed at the",
        "end, where vLLM's own stream and batch disagree too (we keep vLLM's answers).",
        "",
        "## Family rows (the family's tokens and its own output format)",
        "",
        "Every row runs every case at interval 1 with n=1 against vLLM; then our stream of the same case",
        "under a client's `stream_interval` 2, 3 and 7 (and 4 with n=2), with and without a stop string",
        "that never matches, against that unmerged stream ([why](vllm-differences.md#derender-merged-steps)).",
        "Family tokenizers: tests/support/family_tokenizers.py; gpt_oss is o200k_base (from the",
        "`bpe-openai` package, hash-checked as openai_harmony checks it) with harmony's special tokens",
        "(tests/support/harmony_model.py): vLLM renders and parses it with openai_harmony;",
        "qwen3_hf is the demo model with a transformers `response_template` (vLLM's `hf` parser);",
        "cohere is the demo model with Cohere Command's markers and a Cohere2 architecture, served as",
        "vLLM serves Command models (cohere_melody renders the prompt): a row's further flags are in its first cell.",
        "mistral_tekken is Mistral NeMo's own tokenizer (mistral_common's tekken_240718.json, v3) on the demo config,",
        "served as vLLM serves Mistral's checkpoints (`--tokenizer-mode mistral`: mistral_common renders the prompt).",
        "The real-engine proof behind the scripted engine: tests/engine/decode/test_scripted_parity.py (DelegatingParser)",
        "and tests/engine/test_parser_matrix_real.py (ResponseTemplateParser, HarmonyParser on a real",
        "GptOssForCausalLM with dummy weights, KimiK3Parser); MiniCPMVUnifiedParser runs on the scripted engine only.",
        "",
        "Columns: **stream** — the folded stream equals vLLM's; **chunks** — every streamed delta equals",
        "vLLM's, in order; **batch** — the batch message and finish_reason equal vLLM's; **stream = batch**",
        "— our folded stream equals our batch answer; **any chunking** — every merged or held-back stream",
        "folds to the unmerged stream's message and finish_reason.",
        "",
        "| family tokenizer | tool parser | reasoning parser | vLLM's parser class | stream | chunks | batch | stream = batch | any chunking |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if LINE not in r.lines:  # judged by the tier of its line (tests/vllm033 for 0.33)
            out.append(f"{row_key(r)} {COMPOSED.get(r.id, '—')} | " + " | ".join([f"on {', '.join(r.lines)} only (tests/vllm033)"] * 5) + " |")
            continue
        proven = "interval1-n1" in PASSED.get(r.id, set())
        stream = _stream_cell(r.id) if proven else "not run"
        out.append(
            f"{row_key(r)} {COMPOSED.get(r.id, 'not run')} "
            f"| {stream} | {stream} | {'✓' if proven else 'not run'} | {_agreement_cell(r.id) if proven else 'not run'} "
            f"| {_cell(r.id, 'any-chunking')} |"
        )
    out += ["", *forced_table()]
    out += ["", *names_table(*_both_lines())]
    out += ["", "## Not constructible on the demo vocabulary (the error is asserted)", "", "| kind | parser | vLLM says |", "|---|---|---|"]
    for (kind, name), reason in sorted(listed.items()):
        out.append(f"| {kind} | {name} | {reason} |")
    if not listed:
        out[-2:] = ["None: every registered parser constructs on its family's vocabulary (a family row)."]
    out += [
        "",
        "## Refused at start-up on the demo vocabulary (asserted on each line that registers the name)",
        "",
        "`decode-server serve` with the flag on a vocabulary without the parser's tokens stops before an engine",
        "starts, with vLLM's reason (`test_a_parser_without_its_familys_tokens_is_refused_at_start_up_with_its_reason`).",
        "",
        "| kind | parser | lines | vLLM says | its family row |",
        "|---|---|---|---|---|",
    ]
    for (kind, name), reason in sorted(REFUSED_ON_THE_DEMO_VOCABULARY.items()):
        lines = "0.33" if (kind, name) in NEW_IN_033 else "0.32, 0.33"
        homes = [r.id for r in ALL_ROWS if (r.tool_parser if kind == "tool" else r.reasoning_parser) == name]
        out.append(f"| {kind} | {name} | {lines} | {reason} | {', '.join(homes) or '—'} |")
    out += ["", "## Refused by vLLM's render server (asserted; no decode server sees these requests)", ""]
    out += [f"- **{row}**, `{case}`: {message}" for (row, case), message in sorted(REFUSED.items())] or ["None."]
    out += ["", "## A stop string made vLLM's stream lose a call (asserted; finish_reason `stop` there, ours `tool_calls`)", ""]
    out += [f"- **{row}**, `{case}`: {why}" for (row, case), why in sorted(LOST_CALLS.items())] or ["None."]
    out += ["", "## vLLM's parser raised on the family's output (coupled chat answers an error; ours the same status, asserted)", ""]
    out += [
        f"- **{row}**, `{case}`, {part}: {status}, vLLM says `{message}` ([ours](vllm-differences.md#derender-parser-errors))"
        for (row, case, part), (status, message) in sorted(PARSER_ERRORS.items())
    ] or ["None."]
    out += ["", "## Open (not run; what was observed)", ""]
    out += [f"- **{r.id}**: {why}" for r, why in open_rows.items()] or ["None."]
    out += ["", "## Where vLLM's own stream and batch disagree (parity with vLLM kept)", ""]
    if not RECORDED:
        out.append("None found.")
    for (row, case), (stream, batch) in sorted(RECORDED.items()):
        (folded, stream_finish), (batch_message, batch_finish) = stream, batch
        out += [
            f"- **{row}**, `{case}`:",
            f"  - stream folds to `{_short(folded)}`, finish_reason `{stream_finish}`",
            f"  - batch gives `{_short(batch_message)}`, finish_reason `{batch_finish}`",
        ]
        out += [f"  - {part}: {judged or NOT_JUDGED}" for part, judged in _verdicts(row, case, stream, batch).items()]
    return "\n".join(out) + "\n"


NOT_JUDGED = "not judged yet (tests/support/parser_matrix/verdicts.py)"


def row_key(row: Any) -> str:
    """The start of a row's line in the family table (what the staleness test looks for)."""
    return f"| {_family_cell(row)} | {row.tool_parser or '—'} | {row.reasoning_parser or '—'} |"


def _both_lines() -> tuple[list[str], list[str]]:
    """Every name either line registers: this process's registry and the names only 0.33 adds
    (each tier's completeness check holds its own line to the same placement)."""
    from tests.support.parser_matrix.coverage import registered

    tools, reasonings = registered()
    new = lambda kind: {n for k, n in NEW_IN_033 if k == kind}  # noqa: E731
    return sorted(set(tools) | new("tool")), sorted(set(reasonings) | new("reasoning"))


def names_table(tools: list[str], reasonings: list[str]) -> list[str]:
    """Every registered name of both lines with the rows that judge it: a function of the rows and
    the registries alone, so a row added without regenerating this page fails its test."""
    out = [
        "## Every registered name (0.32 and 0.33)",
        "",
        "Judged: its family rows above carry the verdicts (stream, chunks, batch, stream = batch, any chunking).",
        "",
        "| kind | name | lines | judged in | status |",
        "|---|---|---|---|---|",
    ]
    for kind, names in (("tool", tools), ("reasoning", reasonings)):
        for name in names:
            homes = [r.id for r in ALL_ROWS if (r.tool_parser if kind == "tool" else r.reasoning_parser) == name]
            lines = "0.33" if (kind, name) in NEW_IN_033 else "0.32, 0.33"
            if homes:
                status = "judged" + ("; refused at start-up on the demo vocabulary" if (kind, name) in REFUSED_ON_THE_DEMO_VOCABULARY else "")
            elif any((r.tool_parser if kind == "tool" else r.reasoning_parser) == name for r in OPEN):
                status = "open: its row does not pass yet (see Open below)"
            else:
                status = REFUSED_ON_THE_DEMO_VOCABULARY.get((kind, name), "in no row (the completeness test fails)")
            out.append(f"| {kind} | {name} | {lines} | {', '.join(f'`{h}`' for h in homes) or '—'} | {status} |")
    return out


def forced_table() -> list[str]:
    """How each row's tool_choice required and named cases were scripted: what vLLM makes its model write."""

    def rows(json_schema: bool) -> str:
        found = sorted({row for (row, _), forced_json in FORCED.items() if forced_json == json_schema})
        return ", ".join(f"`{r}`" for r in found) or "none"

    return [
        "## tool_choice required and named: what the model is made to write",
        "",
        "Where vLLM's render installs a JSON schema for them (the tool parser reads vLLM's JSON:",
        "`supports_required_and_named`, or Mistral's own schema), guided decoding forces that JSON: for `required`",
        "a list of call objects (`{\"name\", \"parameters\"}`; Mistral's `{\"name\", \"arguments\"}`), for a named tool",
        "its arguments object. The script is that JSON, checked against the schema, and vLLM must read its calls.",
        "Where the render installs none (a structural tag keeps the family's markup, or nothing constrains it),",
        "vLLM reads the calls with the parser: the script is the family's markup, and vLLM must find the call.",
        "A row with a reasoning parser reasons first in both (guided decoding starts where the reasoning ends;",
        "where the prompt opens the reasoning, as step3's, ernie45's and Hunyuan's do, the model has no other way).",
        "",
        "- forced JSON: " + rows(True),
        "- the family's markup: " + rows(False),
        "",
        "vLLM reads no call from the JSON its own render forced (asserted):",
        "",
        *([f"- **{row}**, `{case}`: {why}" for (row, case), why in sorted(UNREAD.items())] or ["None."]),
        "",
        "vLLM's engine never applies the grammar its render installs (scripted as the family's markup; under",
        "`required` vLLM's batch reads no call from it, asserted):",
        "",
        *([f"- **{row}**, `{case}`: {why}" for (row, case), why in sorted(NEVER_APPLIED.items())] or ["None."]),
    ]


def _family_cell(row: Any) -> str:
    return f"{row.family} (`{' '.join(row.serve_flags)}`)" if row.serve_flags else row.family


def _short(message: dict[str, Any]) -> str:
    keep = {k: v for k, v in message.items() if v and k != "role"}
    keep["tool_calls"] = [{k: v for k, v in tc.items() if k != "id"} for tc in keep.get("tool_calls", [])] or None
    return json.dumps({k: v for k, v in keep.items() if v}, ensure_ascii=False)


def write_if_asked(rows: list[Any], open_rows: dict[Any, str], listed: dict[Any, str]) -> None:
    target = os.environ.get("PARSER_MATRIX_DOC")
    if target:
        Path(target).write_text(render(rows, open_rows, listed), encoding="utf-8")
