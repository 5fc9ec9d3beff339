"""Streaming derender gives one message whatever the engine's chunking, stop strings included.

No engine here: the deltas are what vLLM's own detokenizer releases for the request (its stop
buffer holds text back, token ids are not held), merged at random step boundaries the way
AsyncLLM's output collector merges the steps a busy frontend has not read yet. They go
through the real pipeline stages (`token_steps`, `derender_stream`) with vLLM's qwen3 + hermes
parsers (granite's reasoning parser for merged steps). The engine-backed checks are in
tests/app/vllm/test_derender.py and, per parser family against coupled chat, tests/app/vllm/test_parser_matrix.py.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.tokenizers import get_tokenizer
from vllm.v1.engine.detokenizer import IncrementalDetokenizer

from decode_server.config import DerenderConfig
from decode_server.generate.pipeline import derender
from decode_server.generate.pipeline.derender_plan import Derenderer
from decode_server.generate.pipeline.token_text_ends import MergedSteps
from decode_server.generate.pipeline.tokens import token_steps
from tests.support import chat_cases as cc

EOS = 151645
PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
TOOL_TEXT = "<think>\nThe user wants the weather.\n</think>\n\n" + cc.call("get_weather", {"city": "Paris"})
CONTENT_TEXT = "<think>\nok\n</think>\n\nThe answer is 4, sunny."


@pytest.fixture(scope="module")
def vllm_tokenizer(demo_model):
    return get_tokenizer(str(demo_model))


# Granite's format (vLLM's granite reasoning parser: plain text, no special tokens).
GRANITE_TEXT = "Here is my thought process:\nWeigh it — carefully.\nHere is my response:\nIt is sunny in Zürich."


def _derenderer(tokenizer: Any, demo_model: Any, reasoning: str, tool: str | None) -> Derenderer:
    config = DerenderConfig(reasoning_parser=reasoning, tool_call_parser=tool, enable_auto_tool_choice=tool is not None)
    model_config = SimpleNamespace(model=str(demo_model), hf_config=SimpleNamespace(model_type="qwen3"))
    return Derenderer(config, tokenizer, model_config)


@pytest.fixture(scope="module")
def derenderer(vllm_tokenizer, demo_model):
    return _derenderer(vllm_tokenizer, demo_model, "qwen3", "hermes")


@pytest.fixture(scope="module")
def granite(vllm_tokenizer, demo_model):
    return _derenderer(vllm_tokenizer, demo_model, "granite", None)


def _engine_deltas(tokenizer: Any, ids: list[int], sp: SamplingParams, cuts: list[int]) -> list[RequestOutput]:
    """DELTA outputs as the engine's output processor makes them, one per chunk of steps."""
    request = SimpleNamespace(request_id="r", prompt_token_ids=PROMPT, prompt_embeds=None, sampling_params=sp)
    detok = IncrementalDetokenizer.from_new_request(tokenizer, request)
    outputs, start = [], 0
    for end in cuts:
        stop_string = None
        for i in range(start, end):  # one engine step per token
            stop_terminated = ids[i] == EOS
            stop_string = detok.update([ids[i]], stop_terminated)
            if stop_string is not None or stop_terminated:
                end = i + 1
                break
        finished = stop_string is not None or end == len(ids)
        finish = ("stop" if stop_string is not None or ids[end - 1] == EOS else "length") if finished else None
        text = detok.get_next_output_text(finished, delta=True)
        out = CompletionOutput(index=0, text=text, token_ids=ids[start:end], cumulative_logprob=None, logprobs=None, finish_reason=finish)
        outputs.append(RequestOutput("r", None, PROMPT, None, [out], finished))
        if finished:
            break
        start = end
    return outputs


async def _aiter(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def _message(derenderer: Derenderer, outputs: list[RequestOutput], sp: SamplingParams) -> dict[str, Any]:
    plan = derenderer.plan(cc.parse_context({"tools": [cc.WEATHER]}), None)
    steps = derender.derender_stream(token_steps(_aiter(outputs), keep_text_only=True), plan, PROMPT, sp)
    deltas = [msgspec.json.decode(msgspec.json.encode(c.delta)) async for s in steps for c in s.choices]
    return cc.without_ids(cc.accumulate(deltas))


def _chunkings(n: int, count: int, seed: int) -> list[list[int]]:
    """One token per step, everything in one step, and random merges of neighbouring steps."""
    rnd = random.Random(seed)
    out = [list(range(1, n + 1)), [n]]
    for _ in range(count):
        cuts = sorted(rnd.sample(range(1, n), rnd.randrange(1, n - 1)))
        out.append(cuts + [n])
    return out


def _messages(derenderer, tokenizer, ids, sp, chunkings) -> list[dict[str, Any]]:
    return [asyncio.run(_message(derenderer, _engine_deltas(tokenizer, ids, sp, cuts), sp)) for cuts in chunkings]


@pytest.mark.parametrize("text", [TOOL_TEXT, CONTENT_TEXT], ids=["tool_call", "content"])
@pytest.mark.parametrize("stop", [["zz"], ["zzzz"], ["never-in-the-output"], ["x" * 41]], ids=lambda s: f"hold{len(s[0]) - 1}")
def test_a_stop_string_that_never_matches_changes_nothing_whatever_the_chunking(derenderer, vllm_tokenizer, text, stop):
    ids = cc.script_for(vllm_tokenizer, text) + [EOS]
    chunkings = _chunkings(len(ids), 40, seed=len(stop[0]))
    reference = _messages(derenderer, vllm_tokenizer, ids, SamplingParams(), chunkings[:1])[0]
    assert reference["reasoning"] and (reference["tool_calls"] or reference["content"] == "\n\nThe answer is 4, sunny.")
    for cuts, message in zip(chunkings, _messages(derenderer, vllm_tokenizer, ids, SamplingParams(stop=stop), chunkings)):
        assert message == reference, f"chunk ends {cuts}"


def test_a_stop_string_that_matches_gives_the_same_message_whatever_the_chunking(derenderer, vllm_tokenizer):
    ids = cc.script_for(vllm_tokenizer, "<think>\nok\n</think>\n\nThe answer is 4. STOP and more") + [EOS]
    sp = SamplingParams(stop=["STOP"])
    messages = _messages(derenderer, vllm_tokenizer, ids, sp, _chunkings(len(ids), 40, seed=3))
    assert messages[0]["content"] == "\n\nThe answer is 4. " and messages[0]["reasoning"] == "\nok\n"
    assert all(m == messages[0] for m in messages)


def test_without_the_alignment_vllms_parsers_misroute_held_back_text(derenderer, vllm_tokenizer, monkeypatch):
    """What the aligner is for (vLLM 0.32, vLLM #36830/#51641): fed the engine's deltas as they
    come, the parsers leak tag text into content for some chunkings. If a vLLM upgrade fixes
    its parsers this fails, and the aligner can go."""
    monkeypatch.setattr(derender, "holds_text_back", lambda sp: False)
    ids = cc.script_for(vllm_tokenizer, TOOL_TEXT) + [EOS]
    sp = SamplingParams(stop=["zzzz"])
    messages = _messages(derenderer, vllm_tokenizer, ids, sp, _chunkings(len(ids), 40, seed=3))
    assert any(m["content"] != "\n\n" for m in messages)


@pytest.mark.parametrize("text", [TOOL_TEXT, CONTENT_TEXT], ids=["tool_call", "content"])
def test_merged_engine_steps_give_the_unmerged_message(derenderer, vllm_tokenizer, text):
    """AsyncLLM merges the steps a slow reader has not taken, a client sets stream_interval: the
    parser is still fed one id at a time, and each step's deltas go out as one."""
    ids = cc.script_for(vllm_tokenizer, text) + [EOS]
    chunkings = _chunkings(len(ids), 40, seed=7)
    messages = _messages(derenderer, vllm_tokenizer, ids, SamplingParams(), chunkings)
    assert messages[0]["reasoning"] and (messages[0]["tool_calls"] or messages[0]["content"])
    for cuts, message in zip(chunkings, messages):
        assert message == messages[0], f"chunk ends {cuts}"


def test_merged_steps_keep_granites_reasoning(granite, vllm_tokenizer):
    ids = cc.script_for(vllm_tokenizer, GRANITE_TEXT) + [EOS]
    chunkings = _chunkings(len(ids), 40, seed=5)
    messages = _messages(granite, vllm_tokenizer, ids, SamplingParams(), chunkings)
    assert "Weigh it — carefully." in messages[0]["reasoning"] and "It is sunny in Zürich." in messages[0]["content"]
    for cuts, message in zip(chunkings, messages):
        assert message == messages[0], f"chunk ends {cuts}"


def test_fed_merged_steps_whole_granites_parser_loses_the_reasoning(granite, vllm_tokenizer, monkeypatch):
    """What cutting merged steps per id is for (vLLM 0.32): its granite parser, fed several ids
    at once, misroutes the reasoning for some chunkings. If a vLLM upgrade makes every parser
    safe on merged deltas this fails, and the cutting can go."""
    monkeypatch.setattr(MergedSteps, "pieces", lambda self, text, token_ids: None)
    ids = cc.script_for(vllm_tokenizer, GRANITE_TEXT) + [EOS]
    messages = _messages(granite, vllm_tokenizer, ids, SamplingParams(), _chunkings(len(ids), 40, seed=5))
    assert any(m != messages[0] for m in messages[1:])


def test_the_parsers_request_carries_the_constraint_the_render_installed(derenderer):
    """Coupled chat's parsers read the request their adjust_request constrained, and some stream
    differently under it (hy_v4 under a structural tag: tests/app/vllm/test_parser_matrix.py's hy4 row,
    tool_choice required); parse_context does not carry it, the generate request's sampling params do."""
    from vllm.sampling_params import StructuredOutputsParams

    constraint = StructuredOutputsParams(json={"type": "object"})
    ctx = cc.parse_context({"tools": [cc.WEATHER], "tool_choice": "required"})
    assert derenderer.plan(ctx, None, constraint).request.structured_outputs is constraint
    assert derenderer.plan(ctx, None).request.structured_outputs is None
