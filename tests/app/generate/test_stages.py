"""The pure pipeline stages and the wire step, fed recorded engine outputs in-process (no engine).

Fast checks of one stage each; the proof that the whole flow works is the engine tests beside
these (test_tokens.py, test_text.py, test_derender.py), which drive a real AsyncLLM.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput, SamplingMask
from vllm.sampling_params import SamplingParams

from decode_server.errors import EngineGenerationError
from decode_server.generate.pipeline.derender import derender_batch, derender_stream
from decode_server.config import DerenderConfig
from decode_server.generate.pipeline.derender_plan import Derenderer
from decode_server.generate.pipeline.logprobs import with_integer_logprobs
from decode_server.generate.pipeline.steps import Step
from decode_server.generate.pipeline.tokens import token_steps
from decode_server.generate.modes import MODES
from decode_server.generate.pipeline.stats import counted
from decode_server.generate.pipeline.wire import WireContext, batch_response, stream_chunks
from decode_server.runtime.request_record import RequestStats

PROMPT = [9707, 1879]


def output(*choices: CompletionOutput, finished: bool = False, prompt_logprobs: Any = None) -> RequestOutput:
    return RequestOutput("r", None, PROMPT, prompt_logprobs, list(choices), finished)


def choice(token_ids: list[int], text: str = "", finish: str | None = None, index: int = 0, logprobs: Any = None) -> CompletionOutput:
    return CompletionOutput(index=index, text=text, token_ids=token_ids, cumulative_logprob=None, logprobs=logprobs, finish_reason=finish)


async def _aiter(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def _collect(agen: AsyncIterator[Any]) -> list[Any]:
    return [x async for x in agen]


def run(agen: AsyncIterator[Any]) -> list[Any]:
    return asyncio.run(_collect(agen))


def wire_json(obj: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(obj))


# ---------------------------------------------------------------- tokens stage


def test_token_steps_drop_empty_choices_at_the_tokens_level_but_keep_held_back_text():
    outputs = [output(choice([], text="Hel")), output(choice([11], text="lo")), output(choice([], finish="stop"), finished=True)]
    tokens_level = run(token_steps(_aiter(outputs), keep_text_only=False))
    text_level = run(token_steps(_aiter(outputs), keep_text_only=True))
    assert [len(s.choices) for s in tokens_level] == [0, 1, 1], "text alone is not a tokens-level update"
    assert [len(s.choices) for s in text_level] == [1, 1, 1], "held-back text is flushed without new ids"
    assert tokens_level[2].choices[0].finish_reason == "stop", "a finish-only output always reaches the client"


def test_an_engine_error_finish_raises_instead_of_reaching_the_wire():
    with pytest.raises(EngineGenerationError, match="Internal server error"):
        run(token_steps(_aiter([output(choice([1], finish="error"), finished=True)]), keep_text_only=False))


# ---------------------------------------------------------------- logprobs stage


def test_integer_logprobs_keep_the_sampled_token_and_the_top_k_cut():
    positions = [{11: Logprob(-0.5, rank=1), 12: Logprob(-1.0, rank=2), 13: Logprob(-2.0, rank=3)}]
    steps = token_steps(_aiter([output(choice([11], logprobs=positions), finished=True)]), keep_text_only=False)
    (step,) = run(with_integer_logprobs(steps, num_top=2))
    content = step.choices[0].logprobs.content
    assert [(c.token_id, c.logprob, c.rank) for c in content] == [(11, -0.5, 1)]
    assert [t.token_id for t in content[0].top_logprobs] == [11, 12], "top-2 cut, sampled token first"


# ---------------------------------------------------------------- wire stage


def test_stream_chunks_carry_prompt_ids_once_continuous_usage_and_a_final_usage_chunk():
    ctx = WireContext("req-1", "demo", MODES["tokens"], include_usage=True, continuous_usage=True, return_token_ids=True)
    outputs = [output(choice([11])), output(choice([12, 13], finish="stop"), finished=True)]
    stats = RequestStats()
    steps = counted(token_steps(_aiter(outputs), keep_text_only=False), stats, final_only=False)
    chunks = [wire_json(c) for c in run(stream_chunks(ctx, steps, stats))]
    assert chunks[0]["prompt_token_ids"] == PROMPT and "prompt_token_ids" not in chunks[1]
    assert [c["choices"][0]["token_ids"] for c in chunks[:2]] == [[11], [12, 13]]
    assert [c["usage"]["completion_tokens"] for c in chunks[:2]] == [1, 3]
    assert chunks[2] == {"request_id": "req-1", "usage": {"prompt_tokens": 2, "total_tokens": 5, "completion_tokens": 3},
                         "output_mode": "tokens", "choices": []}
    assert (stats.prompt_tokens, stats.completion_tokens, stats.finish_reasons) == (2, 3, ["stop"])


def test_batch_response_is_built_from_the_one_final_step():
    ctx = WireContext("req-2", "demo", MODES["text"])
    final = output(choice([11, 12], text="Hello,", finish="length"), finished=True)
    stats = RequestStats()
    steps = counted(token_steps(_aiter([final]), keep_text_only=True), stats, final_only=True)
    (body,) = [wire_json(asyncio.run(batch_response(ctx, steps, stats)))]
    assert body["choices"] == [{"index": 0, "finish_reason": "length", "stop_reason": None, "token_ids": [11, 12],
                                "routed_experts": None, "sampling_mask": None, "weight_versions": None,
                                "text": "Hello,", "logprobs": None}]
    assert body["usage"]["completion_tokens"] == 2 and body["model"] == "demo" and body["output_mode"] == "text"
    assert stats.first_token_at is not None


def test_withheld_token_ids_are_null_on_the_wire_but_still_counted_in_usage():
    ctx = WireContext("req-3", "demo", MODES["tokens"], include_usage=True)
    masked = choice([11, 12], finish="stop")
    masked.sampling_mask = SamplingMask([[11, 13], [12]])  # the support sets would tell the hidden tokens
    step = Step(output(masked, finished=True))

    async def hidden() -> AsyncIterator[Step]:
        async for s in token_steps(_aiter([step.output]), keep_text_only=False):
            for c in s.choices:
                c.withhold_metadata()
            yield s

    stats = RequestStats()
    chunks = [wire_json(c) for c in run(stream_chunks(ctx, counted(hidden(), stats, final_only=False), stats))]
    assert chunks[0]["choices"][0]["token_ids"] is None and chunks[0]["choices"][0]["logprobs"] is None
    assert chunks[0]["choices"][0]["sampling_mask"] is None  # as vLLM 0.33's batch derender hides it
    assert chunks[1]["usage"]["completion_tokens"] == 2


# ---------------------------------------------------------------- derender stage (no parser)


def test_derender_without_a_parser_makes_the_text_the_content():
    plan = Derenderer(DerenderConfig(response_role="narrator"), tokenizer=None, model_config=None).plan(None, None)
    final = output(choice([11, 12], text="Hello,", finish="stop"), finished=True)
    (step,) = run(derender_batch(token_steps(_aiter([final]), keep_text_only=True), plan))
    assert wire_json(step.choices[0].message) == {
        "role": "narrator", "content": "Hello,", "refusal": None, "annotations": None, "audio": None,
        "function_call": None, "reasoning": None,
    }, "--response-role; every key vLLM's ChatMessage writes, nulls included"
    deltas = [output(choice([11], text="Hel")), output(choice([12], text="lo", finish="stop"), finished=True)]
    steps = run(derender_stream(token_steps(_aiter(deltas), keep_text_only=True), plan, PROMPT, SamplingParams()))
    assert [wire_json(c.delta) for s in steps for c in s.choices] == [{"role": "narrator", "content": ""}, {"content": "Hel"}, {"content": "lo"}]


def _sse_messages(stall_limit_s: float, chunks: list[Any], send_blocks_after: int | None) -> tuple[list[Any], bool]:
    """Run one `sse._Stream` against an ASGI send that never completes after `send_blocks_after`
    messages; return the messages sent and whether the body iterator was closed."""
    from decode_server.http import sse

    closed = False

    async def rest() -> AsyncIterator[Any]:
        nonlocal closed
        try:
            for chunk in chunks:
                yield sse.frame(chunk)  # framed where the step is processed, as the pipeline does
        finally:
            closed = True

    async def run() -> list[Any]:
        sent: list[Any] = []
        never = asyncio.Event()

        async def send(message: Any) -> None:
            if send_blocks_after is not None and len(sent) >= send_blocks_after:
                await never.wait()  # a reader whose socket buffers are full
            sent.append(message)

        async def receive() -> Any:
            await never.wait()

        response = sse.sse_response(None, rest(), stall_limit_s=stall_limit_s)
        await asyncio.wait_for(response({"type": "http", "method": "GET", "asgi": {"spec_version": "2.4"}}, receive, send), 5)
        return sent

    return asyncio.run(run()), closed


def test_a_stream_whose_send_stays_pending_past_the_limit_is_cut_and_its_chunks_closed():
    started = time.monotonic()
    sent, closed = _sse_messages(0.4, [{"n": i} for i in range(100)], send_blocks_after=3)
    took = time.monotonic() - started
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body"]
    assert closed, "the cut closes the chunks (the engine request is aborted)"
    assert 0.4 <= took < 0.4 * 1.25 + 1.0, took


def test_a_stream_that_keeps_sending_is_never_cut_by_the_stall_watch():
    sent, closed = _sse_messages(0.05, [{"n": i} for i in range(3)], send_blocks_after=None)
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert bodies[:3] == [b'data: {"n":0}\n\n', b'data: {"n":1}\n\n', b'data: {"n":2}\n\n']
    assert bodies[3:] == [b"data: [DONE]\n\n"], "[DONE] ends the body: one send, the same bytes on the wire"
    assert [m["more_body"] for m in sent[1:]] == [True, True, True, False]
    assert closed
