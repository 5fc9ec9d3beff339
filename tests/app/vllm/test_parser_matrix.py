"""The parser matrix: derender equals vLLM's coupled /v1/chat/completions for every parser vLLM registers.

In process (tests/support/parser_matrix/harness.py): vLLM's own API server and ours over the same scripted
engine outputs, so the comparison is exact: each batch message, each streamed delta in order
(tool-call ids by shape), each finish_reason. Family rows (tests/support/parser_matrix/families.py) use the
family's tokenizer and scripts in the family's own format, at --stream-interval 1 with n=1 and
--stream-interval 4 with n=2. Every other registered parser that constructs on the demo vocabulary
runs a generic sweep; every one that does not is listed with the error it gives, which is asserted.
"""

from __future__ import annotations

import pytest

from tests.support import chat_cases as cc
from tests.support.inprocess import serve_args
from decode_server.process.cli import server_config
from decode_server.process.parser_check import parser_refusal
from tests.support.parser_matrix import families as fm
from tests.support.parser_matrix.coverage import LISTED, REFUSED_ON_THE_DEMO_VOCABULARY, SWEEP, registered, sweep_cases
from tests.support.parser_matrix.harness import Pair, Side, pair
from tests.support.parser_matrix.models import family_model
from tests.support.parser_matrix import report

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", autouse=True)
def parsers_doc():
    yield
    report.write_if_asked(fm.ROWS, fm.OPEN, SWEEP, LISTED)


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
    assert ours.batch.keys() == theirs.batch.keys(), where
    for i in theirs.batch:
        assert ours.batch[i] == theirs.batch[i], (where, "batch", i)
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


async def _run(p: Pair, row_id: str, case: fm.Case, n: int, interval: int) -> None:
    script = p.tokenizer.encode(case.text, add_special_tokens=False)
    ours, theirs = await p.compare({**case.chat, "n": n}, script)
    where = f"{row_id} {case.name} n={n} interval={interval}"
    if case.calls:
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
            assert not _stream_equals_batch(theirs, i), f"{where}: our stream and batch differ where vLLM's agree"
            unjudged = report.record(row_id, case.name, (ours.folded(i), ours.stream_finish(i)), (ours.batch_folded(i), ours.batch_finish(i)))
            assert not unjudged, f"{where}: vLLM's stream and batch differ in {unjudged}; say which is right in tests/support/parser_matrix/verdicts.py"


# Every row at interval 1 with n=1 on every case, and at interval 4 with n=2 (multi-token deltas,
# two choices) on the cases where markup spans deltas. A configuration is one pair of servers; a
# row's two run one after the other, on the model directory the scripted engine has loaded.
CONFIGS = [(row, interval, n) for row in fm.ROWS for interval, n in ((1, 1), (4, 2))]


@pytest.mark.parametrize("row,interval,n", CONFIGS, ids=lambda v: v.id if isinstance(v, fm.Row) else str(v))
async def test_family_row_matches_vllms_chat(family_dir, row: fm.Row, interval: int, n: int):
    async with pair(family_dir(row.family), *row.flags, "--stream-interval", str(interval)) as p:
        for case in fm.cases(row):
            if await _refused(p, row, case):
                continue
            if interval == 1 or case.name in fm.MULTI_TOKEN_CASES:
                await _run(p, row.id, case, n, interval)
        report.composed(row.id, p.vllm.app.state.openai_serving_chat.parser_cls)
    report.passed(row.id, f"interval{interval}-n{n}")


@pytest.mark.parametrize("config", SWEEP, ids=lambda c: f"{c[0] or '-'}+{c[1] or '-'}")
async def test_sweep_parser_matches_vllms_chat(family_dir, config):
    tool, reasoning = config
    async with pair(family_dir("qwen3"), *fm.flags(tool, reasoning)) as p:
        for case in sweep_cases(tool is not None):
            await _run(p, f"demo:{tool or '-'}+{reasoning or '-'}", case, 1, 1)
        report.composed(f"demo:{tool or '-'}+{reasoning or '-'}", p.vllm.app.state.openai_serving_chat.parser_cls)
    report.passed(f"demo:{tool or '-'}+{reasoning or '-'}", "sweep")


def test_every_registered_parser_is_in_the_matrix_or_listed_with_its_reason():
    tools, reasonings = registered()
    rows = [*fm.ROWS, *fm.OPEN]  # an open row states its observed failure (families.OPEN)
    in_rows = {("tool", r.tool_parser) for r in rows} | {("reasoning", r.reasoning_parser) for r in rows}
    in_sweep = {("tool", t) for t, _ in SWEEP} | {("reasoning", r) for _, r in SWEEP}
    for kind, names in (("tool", tools), ("reasoning", reasonings)):
        for name in names:
            assert (kind, name) in in_rows | in_sweep | set(LISTED), f"{kind} parser {name!r} is neither in the matrix nor listed"
    stale = [k for k in LISTED if k[1] not in (tools if k[0] == "tool" else reasonings)]
    assert not stale, f"listed but no longer registered: {stale}"


@pytest.mark.parametrize("key", sorted(REFUSED_ON_THE_DEMO_VOCABULARY), ids=lambda k: f"{k[0]}:{k[1]}")
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
