"""Start-up refusal: parser flags that cannot work with the served tokenizer stop `decode-server serve`
with one line naming the flag, the parser and what is missing, before any engine starts.

Every parser vLLM cannot construct on the demo vocabulary is refused with its reason in
tests/app/vllm/test_parser_matrix.py (the LISTED parsers); here the command itself, and flags that work.
"""

from __future__ import annotations

import pytest

from decode_server.process import cli
from decode_server.process.parser_check import parser_refusal
from tests.support.inprocess import serve_args


def test_serve_refuses_llama3_json_on_a_vocabulary_without_python_tag(demo_model, capsys, monkeypatch):
    from decode_server.runtime.engine import Engine

    def engine_start(*args, **kwargs):
        raise AssertionError("the engine started")

    monkeypatch.setattr(Engine, "start", engine_start)
    monkeypatch.setattr("decode_server.runtime.access_log.configure", lambda *args: None)  # the test's logging stays
    parser = cli.build_parser()
    args = parser.parse_args(["serve", str(demo_model), "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"])
    assert cli.serve(args, cli.serve_defaults(parser)) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("decode-server:")]
    assert len(lines) == 1, lines
    assert "--tool-call-parser llama3_json" in lines[0] and "'<|python_tag|>'" in lines[0], lines[0]
    assert str(demo_model) in lines[0], lines[0]


def test_hf_without_a_response_template_is_refused_with_the_flag(demo_model):
    """The `hf` parser's own check raises without naming the flag; the refusal line adds it."""
    args = serve_args(demo_model, "--reasoning-parser", "hf")
    refusal = parser_refusal(args, cli.server_config(args).derender)
    assert refusal == (
        f"--reasoning-parser hf cannot be used with {str(demo_model)!r}: "
        "The hf parser requires `response_template` metadata in the tokenizer configuration"
    ), refusal


@pytest.mark.parametrize(
    "flags",
    [
        ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"],
        ["--reasoning-parser", "deepseek_r1"],
        ["--tool-call-parser", "llama3_json"],  # without --enable-auto-tool-choice no tool parser is built
        [],
    ],
    ids=["hermes+qwen3", "deepseek_r1", "tool-parser-without-auto", "none"],
)
def test_flags_that_work_are_not_refused(demo_model, flags):
    args = serve_args(demo_model, *flags)
    assert parser_refusal(args, cli.server_config(args).derender) is None


def test_tokens_only_has_no_parser_to_check(demo_model):
    args = serve_args(demo_model, "--tokens-only", "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json")
    assert parser_refusal(args, cli.server_config(args).derender) is None


@pytest.mark.anyio
async def test_a_parser_that_works_only_in_harmony_answers_as_vllm_does(demo_model):
    """`--tool-call-parser openai` on a model that is not gpt-oss: vLLM starts and its parser answers
    every request 501 with why; ours gives the same status and message, not an internal error."""
    from tests.support import chat_cases as cc
    from tests.support.parser_matrix.harness import CHAT, pair
    from tests.support import GENERATE

    async with pair(demo_model, "--enable-auto-tool-choice", "--tool-call-parser", "openai") as p:
        chat = cc.chat_body(tools=[cc.WEATHER])
        script = p.tokenizer.encode("It is sunny.", add_special_tokens=False)
        theirs = await p.vllm.client.post(CHAT, json={**chat, "vllm_xargs": {"replay_token_ids": script}})
        ours = await p.ours.client.post(GENERATE, json=await p.derender_request(chat, script))
    assert theirs.status_code == ours.status_code == 501, (theirs.text, ours.text)
    assert ours.json()["error"]["message"] == theirs.json()["error"]["message"] == (
        "GptOssToolParser is a stub. Use HarmonyParser for tool parsing."
    )
