"""The parser matrix: derender equals vLLM's coupled /v1/chat/completions for every parser vLLM registers.

In process (tests/support/parser_matrix/harness.py): vLLM's own API server and ours over the same scripted
engine outputs, so the comparison is exact: each batch message, each streamed delta in order
(tool-call ids by shape), each finish_reason. Family rows (tests/support/parser_matrix/families.py) use the
family's tokenizer and scripts in the family's own format, at --stream-interval 1 with n=1; then our
stream, merged by a client's stream_interval (2, 3, 7; 4 with n=2) and with and without a stop
string that never matches, must fold to that unmerged stream's message (vLLM's own parsers do not
all give it on merged steps: docs/vllm-differences.md#derender-merged-steps). Every registered
parser is in a family row, and a name neither in a row nor listed with its reason fails the
completeness check; a parser that refuses a vocabulary without its family's tokens says so at
start-up, which is asserted."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
from pathlib import Path

import jsonschema
import pytest

from tests.support import chat_cases as cc
from tests.support.inprocess import serve_args
from decode_server.process.cli import server_config
from decode_server.process.parser_check import parser_refusal
from tests.support.parser_matrix import families as fm
from tests.support.parser_matrix.coverage import LISTED, REFUSED_ON_THE_DEMO_VOCABULARY, registered, stale, unplaced
from tests.support.parser_matrix.harness import Pair, Side, pair
from tests.support.parser_matrix.models import family_model
from tests.support.parser_matrix.mistral_mode import script_of
from tests.support.parser_matrix import report
from tests.support.parser_matrix.verdicts import BY_HAND

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", autouse=True)
def parsers_doc():
    yield
    report.write_if_asked(fm.ALL_ROWS, fm.OPEN, LISTED)


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory, demo_model):
    # The session's demo model is the qwen3 family and every family's base: in-process servers on
    # it share their tokenizer with the suite's other in-process tests.
    root = tmp_path_factory.mktemp("families")
    return lambda family: family_model(family, root, demo_model)


@pytest.fixture(scope="module")
def demo_tokenizer(family_dir):
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(family_dir("qwen3")))


def _assert_parity(ours: Side, theirs: Side, where: str, case: fm.Case) -> None:
    assert ours.batch.keys() == theirs.batch.keys() and ours.stream.keys() == theirs.stream.keys(), where
    for i in theirs.batch:
        assert ours.batch[i] == theirs.batch[i], (where, "batch", i)
    for i in theirs.stream:  # a batch answer that is an error still has its stream compared
        if case.differs is None:
            assert ours.stream[i] == theirs.stream[i], (where, "stream", i)
        elif case.lost_call:
            # vLLM's misrouted stream sent no call and says `stop`; ours sent the call (as vLLM's
            # parser does on aligned text) and says `tool_calls`, by coupled chat's own rule.
            streamed = (bool(ours.folded(i).get("tool_calls")), bool(theirs.folded(i).get("tool_calls")))
            assert streamed == (True, False), (where, "lost call", i)
            assert (ours.stream_finish(i), theirs.stream_finish(i)) == ("tool_calls", "stop"), (where, "finish", i)
        else:
            assert ours.stream_finish(i) == theirs.stream_finish(i), (where, "finish", i)


def _assert_same_error(ours: Side, theirs: Side, where: str, row_id: str, case: fm.Case) -> None:
    """Where vLLM's parser raised, coupled chat answers with vLLM's status and type: so do we, with a
    message that says the parser failed on the model output, then vLLM's (docs/vllm-differences.md#derender-parser-errors)."""
    for part in ("batch_error", "stream_error"):
        mine, vllms = getattr(ours, part), getattr(theirs, part)
        assert (mine is None) == (vllms is None), (where, part, mine, vllms)
        if vllms is None:
            continue
        assert (mine["code"], mine["type"]) == (vllms["code"], vllms["type"]), (where, part, mine, vllms)
        assert mine["message"].startswith("vLLM's parser (") and mine["message"].endswith(": " + vllms["message"]), (where, part, mine)
        report.parser_error(row_id, case.name, part.split("_")[0], vllms["code"], vllms["message"])


def _stream_equals_batch(side: Side, i: int) -> bool:
    same_message = cc.without_ids(side.folded(i)) == cc.without_ids(side.batch_folded(i))
    return same_message and side.stream_finish(i) == side.batch_finish(i)


async def _refused(p: Pair, row: fm.Row, case: fm.Case) -> bool:
    expected = dict(row.refused_at_render).get(case.name)
    if expected is None:
        return False
    status, message = await p.render_error(case.chat)
    assert status == 400 and expected in message, (row.id, case.name, status, message)
    report.refused(row.id, case.name, message)
    return True


async def _as_vllm_forces(p: Pair, row: fm.Row, case: fm.Case) -> fm.Case:
    """A required or named tool_choice scripted as what vLLM makes the model write: where its render
    installs a JSON schema (guided decoding), the reasoning and then JSON that meets it, whose calls vLLM
    must read; where it installs none, the family's markup as the case has it."""
    if case.guided is None:
        return case
    constraint = (await p.rendered_sampling(cc.chat_body(**case.chat, n=1))).get("structured_outputs") or {}
    schema = json.loads(constraint["json"]) if isinstance(constraint.get("json"), str) else constraint.get("json")
    report.forced(row.id, case.name, schema is not None and not row.grammar_never_applied)
    if schema is None:
        return case
    if row.grammar_never_applied:  # the family's markup, of which the batch reads a named call only
        report.never_applied(row.id, case.name, row.grammar_never_applied)
        return dataclasses.replace(case, calls=case.calls if case.chat["tool_choice"] != "required" else ())
    forced = fm.forced_json(schema, named=case.chat["tool_choice"] != "required")
    jsonschema.validate(json.loads(forced), schema)
    names = tuple(call["name"] for call in json.loads(forced)) if forced.startswith("[") else case.calls
    if row.forced_json_unread:
        report.unread(row.id, case.name, row.forced_json_unread)
        names = ()  # asserted: vLLM's batch answer holds no call
    return dataclasses.replace(case, text=case.guided + forced, calls=names)


async def _run(p: Pair, row_id: str, case: fm.Case, n: int, interval: int) -> Side:
    """Parity with vLLM on one case; our side's answers."""
    script = script_of(p.tokenizer, case.text)
    ours, theirs = await p.compare({**case.chat, "n": n}, script)
    where = f"{row_id} {case.name} n={n} interval={interval}"
    _assert_same_error(ours, theirs, where, row_id, case)
    if case.calls or case.guided is not None:  # a forced tool_choice: exactly these calls, or none
        assert theirs.batch_error is None, f"{where}: vLLM's parser raised on the family's calls: {theirs.batch_error}"
        names = tuple(tc["function"]["name"] for tc in theirs.batch[0][0].get("tool_calls") or [])
        assert names == case.calls, f"{where}: vLLM did not parse the script as the family's calls: {theirs.batch[0][0]}"
    _assert_parity(ours, theirs, where, case)
    if case.differs is not None:
        report.on_purpose(row_id, case.name, case.differs)
    if case.lost_call:
        report.lost_call(row_id, case.name, case.lost_call)
    for i in ours.batch:
        if not _stream_equals_batch(ours, i):
            # Beyond vLLM: the folded stream is the batch answer, unless vLLM's own chat differs
            # there too (then parity wins, and docs/parsers.md records the case).
            # The answer is the message and its finish_reason: a client acts on both.
            # Where a stop string made vLLM's stream lose the call, ours (the parser on aligned text) stands for
            # vLLM's stream: whether it agrees with the batch is judged below like any other case.
            assert case.lost_call or not _stream_equals_batch(theirs, i), f"{where}: our stream and batch differ where vLLM's agree"
            unjudged = report.record(row_id, case.name, (ours.folded(i), ours.stream_finish(i)), (ours.batch_folded(i), ours.batch_finish(i)))
            assert not unjudged, f"{where}: vLLM's stream and batch differ in {unjudged}; say which is right in tests/support/parser_matrix/verdicts.py"
    return ours


# A stop string no script holds, longer than any tag: the engine's stop buffer holds the most text
# back (docs/vllm-differences.md#derender-stop-string-alignment).
NEVER_MATCHING = "never in any script: ☂☂☂"
# (a client's stream_interval, n, a never-matching stop string too): how the unmerged stream of
# the parity check is merged and held back here; its message must not change.
CHUNKINGS = [
    *((interval, 1, stop) for interval in (1, 2, 3, 7) for stop in (False, True) if (interval, stop) != (1, False)),
    (4, 2, False),
]


async def _any_chunking(p: Pair, row_id: str, case: fm.Case, unmerged: Side) -> None:
    """Our folded stream and its finish_reason under every chunking equal the unmerged stream's
    (which equals vLLM's, delta by delta, and its batch answer where vLLM's own two agree)."""
    script = script_of(p.tokenizer, case.text)
    request = await p.derender_request(cc.chat_body(**case.chat, n=1), script)  # the parity check's render
    want = (cc.without_ids(unmerged.folded(0)), unmerged.stream_finish(0), unmerged.stream_error)

    def chunked(interval: int, n: int, stop: bool) -> dict:
        sampling = {**request["sampling_params"], "stream_interval": interval, "n": n}
        if stop:
            sampling["stop"] = [*(sampling.get("stop") or []), NEVER_MATCHING]
        return {**request, "sampling_params": sampling}

    # All chunkings at once: the engine steps them together (one step, one lockstep wait for all
    # streams, instead of one per stream), and each stream keeps its own parser and interval.
    sides = await asyncio.gather(*(p.ours_streamed(chunked(*chunking)) for chunking in CHUNKINGS))
    for (interval, n, stop), side in zip(CHUNKINGS, sides):
        for i in range(n):
            got = (cc.without_ids(side.folded(i)), side.stream_finish(i), side.stream_error)
            assert got == want, f"{row_id} {case.name}: stream_interval={interval} n={n} stop={stop} choice {i}"


# Every row on every case: parity at interval 1 with n=1, then the same scripts under every chunking.
# A configuration is one pair of servers, on the model directory the scripted engine has loaded.
CONFIGS = [(row, 1, 1) for row in fm.ROWS]


@pytest.mark.parametrize("row,interval,n", CONFIGS, ids=lambda v: v.id if isinstance(v, fm.Row) else str(v))
async def test_family_row_matches_vllms_chat(family_dir, row: fm.Row, interval: int, n: int):
    async with pair(family_dir(row.family), *row.flags, "--stream-interval", str(interval)) as p:
        for case in fm.cases(row):
            if await _refused(p, row, case):
                continue
            case = await _as_vllm_forces(p, row, case)
            unmerged = await _run(p, row.id, case, n, interval)
            await _any_chunking(p, row.id, case, unmerged)
        report.composed(row.id, p.vllm.app.state.openai_serving_chat.parser_cls)
    # A verdict judged by hand is kept only while a case needs it (a fixed parser, or a fixed stream
    # of ours, leaves it judging nothing).
    unused = [case for r, case in BY_HAND if r == row.id and (r, case) not in report.RECORDED]
    assert not unused, f"{row.id}: by-hand verdicts no case needs on vLLM {fm.LINE} (tests/support/parser_matrix/verdicts.py): {unused}"
    report.passed(row.id, f"interval{interval}-n{n}")
    report.passed(row.id, "any-chunking")


def test_every_registered_parser_is_in_the_matrix_or_listed_with_its_reason():
    tools, reasonings = registered()
    assert not unplaced(tools, reasonings), f"vLLM {fm.LINE} registers parsers in no row and not listed: {unplaced(tools, reasonings)}"
    assert not stale(tools, reasonings, fm.LINE), f"placed but not registered on vLLM {fm.LINE}: {stale(tools, reasonings, fm.LINE)}"


def test_a_parser_a_new_vllm_registers_fails_the_completeness_check(monkeypatch):
    """The check reads the registries themselves: a name added there, in no row, is named."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    for manager in (ToolParserManager, ReasoningParserManager):
        listed = manager.list_registered
        monkeypatch.setattr(manager, "list_registered", lambda listed=listed: [*listed(), "planted_by_the_test"])
    with pytest.raises(AssertionError, match="'planted_by_the_test'") as failed:
        test_every_registered_parser_is_in_the_matrix_or_listed_with_its_reason()
    assert "('tool', 'planted_by_the_test')" in str(failed.value) and "('reasoning', 'planted_by_the_test')" in str(failed.value)


PARSERS_DOC = Path(__file__).resolve().parents[3] / "docs" / "parsers.md"


def test_docs_parsers_md_is_generated_from_these_rows(doc: str | None = None):
    """docs/parsers.md is regenerated whenever rows or names change: every row has its line in the
    family table and the names table is the one these rows and registries give, on either line."""
    if doc is None and os.environ.get("PARSER_MATRIX_DOC"):
        pytest.skip("this run writes docs/parsers.md at its end: the next run checks it")
    doc = PARSERS_DOC.read_text(encoding="utf-8") if doc is None else doc
    missing = [r.id for r in fm.ALL_ROWS if f"\n{report.row_key(r)} " not in doc]
    assert not missing, f"rows not in docs/parsers.md (regenerate it: PARSER_MATRIX_DOC=docs/parsers.md): {missing}"
    stale_table = "\n".join(report.names_table(*report._both_lines()))
    assert stale_table in doc, "docs/parsers.md's name table is stale: regenerate it (PARSER_MATRIX_DOC=docs/parsers.md)"
    assert "| not run |" not in doc, "docs/parsers.md was generated by a run that did not run every row"


def test_a_stale_parsers_doc_fails_the_check():
    """A row dropped from the page, or a name's status changed, is caught."""
    doc = PARSERS_DOC.read_text(encoding="utf-8")
    row = fm.ALL_ROWS[-1]
    with pytest.raises(AssertionError, match=re.escape(row.id)):
        test_docs_parsers_md_is_generated_from_these_rows(doc.replace(f"\n{report.row_key(row)} ", "\n"))
    with pytest.raises(AssertionError, match="name table is stale"):
        test_docs_parsers_md_is_generated_from_these_rows(doc.replace("| tool | hermes | 0.32, 0.33 |", "| tool | hermes | 0.32 |"))


def _registered_here(key: tuple[str, str]) -> bool:
    tools, reasonings = registered()
    return key[1] in (tools if key[0] == "tool" else reasonings)


@pytest.mark.parametrize("key", sorted(filter(_registered_here, REFUSED_ON_THE_DEMO_VOCABULARY)), ids=lambda k: f"{k[0]}:{k[1]}")
def test_a_parser_without_its_familys_tokens_is_refused_at_start_up_with_its_reason(family_dir, demo_tokenizer, key):
    """What `decode-server serve` says before starting an engine when the served vocabulary lacks the
    parser's tokens: one line, the flag and vLLM's reason (a listed parser is one of these)."""
    kind, name = key
    flags = ["--enable-auto-tool-choice", "--tool-call-parser", name] if kind == "tool" else ["--reasoning-parser", name]
    args = serve_args(family_dir("qwen3"), *flags)
    refusal = parser_refusal(args, server_config(args).derender, demo_tokenizer)
    assert refusal is not None and "\n" not in refusal, refusal
    assert f"--{'tool-call' if kind == 'tool' else 'reasoning'}-parser {name}" in refusal, refusal
    assert REFUSED_ON_THE_DEMO_VOCABULARY[key] in refusal, refusal


def test_the_hunyuan_a13b_family_numbers_its_markers_as_vllms_parser_matches_them(family_dir):
    """vLLM's streaming hunyuan_a13b reasoning parser switches on Hunyuan's own token ids, one id a delta:
    the family tokenizer must encode the think and answer markers to exactly those ids (the format's
    empty think block included), else its row would judge a stream that never leaves `idle`."""
    from vllm.reasoning.hunyuan_a13b_reasoning_parser import HunyuanA13BReasoningParser
    from vllm.tokenizers import get_tokenizer

    from tests.support.parser_matrix.formats import FORMATS

    tokenizer = get_tokenizer(str(family_dir("hunyuan_a13b")))
    parser = HunyuanA13BReasoningParser(tokenizer)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    assert encode("<think>\n") == parser.think_start_ids and encode("<think>\n\n") == parser.think_start_ids_fast
    assert encode("\n</think>\n<answer>\n") == parser.response_start_ids
    assert encode("</think>\n<answer>\n") == parser.response_start_ids_fast
    assert encode("\n</answer>") == parser.response_end_ids
    assert encode(FORMATS["hunyuan_a13b"].opening) == parser.fast_think_ids
