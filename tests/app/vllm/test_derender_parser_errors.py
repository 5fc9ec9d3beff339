"""An exception vLLM's own parser raises on the model output is an answer with vLLM's status and a
reason, never a bare 500 (decode_server/generate/pipeline/parser_errors.py).

The oracle is vLLM's coupled /v1/chat/completions on the same scripted outputs (tests/support/parser_matrix/harness.py):
InternLM2's parser raises in its batch extraction on a call cut by max_tokens (JSONDecodeError, a
ValueError: vLLM answers 400), on a second action in one turn in both extractions (ValueError: 400;
the stream as an error event after what it had sent), and on an action without a name (KeyError:
vLLM answers 500). Ours answers the same status and type; its message says what failed, then
vLLM's (docs/vllm-differences.md#derender-parser-errors)."""

from __future__ import annotations

import json

import pytest

from tests.support import chat_cases as cc
from tests.support.parser_matrix import families as fm
from tests.support.parser_matrix.harness import Side, pair
from tests.support.parser_matrix.models import family_model

pytestmark = pytest.mark.anyio

PREFIX = "vLLM's parser (--tool-call-parser internlm) could not parse the model output: "
TOOLS = {"tools": fm.TOOLS}


def _action(obj: dict) -> str:
    return "<|action_start|><|plugin|>\n" + json.dumps(obj, ensure_ascii=False) + "<|action_end|>"


WEATHER = {"name": "get_weather", "parameters": fm.WEATHER_ARGS}


async def _both(p, text: str, **chat) -> tuple[Side, Side]:
    return await p.compare({**TOOLS, **chat}, p.tokenizer.encode(text, add_special_tokens=False))


async def test_a_parser_exception_is_vllms_status_with_a_reason(demo_model, tmp_path_factory):
    model = family_model("internlm", tmp_path_factory.mktemp("families"), demo_model)
    async with pair(model, *fm.flags("internlm", None)) as p:
        # vLLM's chat stream returns on a parser error without closing its engine stream (the request is
        # aborted only when that generator is collected): the engines must not wait for every reader
        # (the harness's lockstep), and the streams are compared folded, not chunk by chunk.
        p.ours.core.lockstep_timeout_s = p.vllm.core.lockstep_timeout_s = 1.0
        # The case: a call cut by max_tokens. Batch: vLLM's 400 (its message is the bare
        # JSON error); the stream holds the cut action back and finishes with `length`, on both.
        ours, theirs = await _both(p, _action(WEATHER), max_tokens=9)
        assert theirs.batch_error["code"] == 400 and theirs.batch_error["message"].startswith("Unterminated string"), theirs.batch_error
        assert ours.batch_error == {**theirs.batch_error, "message": PREFIX + "JSONDecodeError: " + theirs.batch_error["message"]}
        assert (ours.stream_error, ours.stream_finish(0)) == (theirs.stream_error, theirs.stream_finish(0)) == (None, "length")

        # Two actions in one turn: both extractions unpack a split in two. The stream sent the first
        # call's deltas, then an error event: ours the same deltas, the same status.
        ours, theirs = await _both(p, "Checking. " + _action(WEATHER) + _action({"name": "search", "parameters": fm.SEARCH_ARGS}))
        vllms = "too many values to unpack (expected 2)"
        assert (theirs.batch_error["code"], theirs.batch_error["type"], theirs.batch_error["message"]) == (400, "BadRequestError", vllms)
        assert ours.batch_error == {**theirs.batch_error, "message": PREFIX + "ValueError: " + vllms}
        assert theirs.stream_error == theirs.batch_error and ours.stream_error == ours.batch_error, (ours.stream_error, theirs.stream_error)
        assert cc.without_ids(ours.folded(0)) == cc.without_ids(theirs.folded(0))
        assert ours.folded(0)["tool_calls"][0]["name"] == "get_weather", ours.folded(0)

        # An action without a name: a KeyError, which vLLM answers 500 with the bare key; ours says
        # which parser and what it raised.
        ours, theirs = await _both(p, _action({"parameters": {}}))
        assert (theirs.batch_error["code"], theirs.batch_error["type"], theirs.batch_error["message"]) == (500, "InternalServerError", "'name'")
        assert ours.batch_error == {**theirs.batch_error, "message": PREFIX + "KeyError: 'name'"}
