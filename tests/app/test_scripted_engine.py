"""The scripted engine keeps vLLM's contract: what a request's script, sampling params and the
test hooks make of its RequestOutputs (vLLM's OutputProcessor builds them from the scripted steps).

The real-engine check of the same scripts is tests/engine/decode/test_scripted_parity.py.
"""

from __future__ import annotations

import asyncio

import pytest
from vllm.inputs.engine import tokens_input
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.exceptions import EngineDeadError

from tests.support.inprocess import scripted_llm
from tests.support.servers import PARSER_FLAGS

pytestmark = pytest.mark.anyio

PROMPT = [9707, 1879]
IM_END = 151645  # the demo model's EOS
DELTA, FINAL = RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY


@pytest.fixture
async def llm(demo_model):
    llm = scripted_llm(demo_model, *PARSER_FLAGS)
    yield llm
    llm.shutdown()


def params(script: list[int] | None, kind: RequestOutputKind = DELTA, **fields) -> SamplingParams:
    extra = {**fields.pop("extra_args", {}), **({} if script is None else {"replay_token_ids": script})}
    return SamplingParams(output_kind=kind, extra_args=extra, **{"max_tokens": 32, **fields})


async def outputs(llm, sp: SamplingParams, request_id: str = "r", prompt: list[int] = PROMPT) -> list:
    return [out async for out in llm.generate(tokens_input(prompt), sp, request_id)]


def tokens(outs: list, index: int = 0) -> list[int]:
    return [t for out in outs for o in out.outputs if o.index == index for t in o.token_ids]


def final(outs: list, index: int = 0):
    return next(o for o in outs[-1].outputs if o.index == index)


async def test_tokens_follow_the_script_then_eos_one_per_step(llm):
    script = [9707, 11, 1879, 0]
    outs = await outputs(llm, params(script))
    assert [o.outputs[0].token_ids for o in outs] == [[t] for t in script + [IM_END]]
    assert (final(outs).finish_reason, final(outs).stop_reason, outs[-1].finished) == ("stop", None, True)
    assert "".join(o.outputs[0].text for o in outs) == "Hello, world!"
    batch = await outputs(llm, params(script, FINAL), "b")
    assert len(batch) == 1 and batch[0].outputs[0].token_ids == script + [IM_END]
    assert batch[0].outputs[0].text == "Hello, world!"


async def test_a_request_without_a_script_follows_the_default_script(llm):
    assert tokens(await outputs(llm, params(None))) == [IM_END]
    llm.core.model.default_script = [11, 11]
    assert tokens(await outputs(llm, params(None), "again")) == [11, 11, IM_END]


async def test_max_tokens_ends_with_length_and_ignore_eos_repeats_eos(llm):
    outs = await outputs(llm, params([9707, 11, 1879], max_tokens=2))
    assert (tokens(outs), final(outs).finish_reason) == ([9707, 11], "length")
    outs = await outputs(llm, params([9707], ignore_eos=True, max_tokens=4), "eos")
    assert (tokens(outs), final(outs).finish_reason) == ([9707, IM_END, IM_END, IM_END], "length")


async def test_max_model_len_ends_with_length(llm):
    outs = await outputs(llm, params([], ignore_eos=True, max_tokens=8), prompt=[9707] * 4093)
    assert (len(tokens(outs)), final(outs).finish_reason) == (3, "length")


async def test_a_stop_token_id_ends_the_request_with_it_as_stop_reason(llm):
    outs = await outputs(llm, params([9707, 11, 1879], stop_token_ids=[11]))
    assert (tokens(outs), final(outs).finish_reason, final(outs).stop_reason) == ([9707, 11], "stop", 11)


async def test_a_stop_string_is_cut_from_the_text_and_the_engine_request_ends(llm):
    script = llm.tokenizer.encode("Hello there STOP and more")
    outs = await outputs(llm, params(script, FINAL, stop=["STOP"]))
    choice = final(outs)
    assert (choice.text, choice.finish_reason, choice.stop_reason) == ("Hello there ", "stop", "STOP")
    assert llm.tokenizer.decode(choice.token_ids).endswith("STOP"), "ids up to the token that completed it"
    assert llm.core.running == [] and llm.core.aborted, "vLLM aborts the engine request the detokenizer stopped"


async def test_min_tokens_holds_back_stop_strings_but_not_the_scripts_eos(llm):
    script = llm.tokenizer.encode("ab ab ab")
    stopped = final(await outputs(llm, params(script, FINAL, stop=["ab"], min_tokens=2)))
    assert stopped.stop_reason == "ab" and len(stopped.token_ids) > 1, "the first 'ab' is within min_tokens"
    short = final(await outputs(llm, params([9707], FINAL, min_tokens=5), "eos"))
    assert (short.token_ids, short.finish_reason) == ([9707, IM_END], "stop"), "the replay forces EOS past min_tokens"


async def test_n_choices_each_follow_the_script(llm):
    outs = await outputs(llm, params([9707, 11], FINAL, n=2))
    assert sorted(o.index for o in outs[-1].outputs) == [0, 1]
    for index in (0, 1):
        assert (final(outs, index).token_ids, final(outs, index).finish_reason) == ([9707, 11, IM_END], "stop")


async def test_logprobs_have_vllms_shape(llm):
    k, script = 3, [9707, 11]
    outs = await outputs(llm, params(script, FINAL, logprobs=k, prompt_logprobs=2))
    positions = final(outs).logprobs
    assert len(positions) == len(script) + 1
    for token, entry in zip(script + [IM_END], positions, strict=True):
        assert token in entry and len(entry) in (k, k + 1), "the sampled token and the top k"
        assert set(range(1, k + 1)) <= {lp.rank for lp in entry.values()}
    prompt = outs[-1].prompt_logprobs
    assert prompt[0] is None and len(prompt) == len(PROMPT)
    assert PROMPT[1] in prompt[1] and len(prompt[1]) in (2, 3)


async def test_logprob_token_ids_score_the_asked_ids(llm):
    outs = await outputs(llm, params([9707], FINAL, logprob_token_ids=[5, 6]))
    for entry in final(outs).logprobs:
        assert {5, 6} <= set(entry) and len(entry) == 3


async def test_kv_transfer_params_come_back_from_the_connector_hook(llm):
    llm.core.finished_kv_transfer_params = lambda request: {"do_remote_prefill": True, "remote_block_ids": [1]}
    outs = await outputs(llm, params([9707], FINAL, extra_args={"kv_transfer_params": {"do_remote_decode": True}}))
    assert outs[-1].kv_transfer_params == {"do_remote_prefill": True, "remote_block_ids": [1]}
    assert llm.core.seen[-1].sampling_params.extra_args["kv_transfer_params"] == {"do_remote_decode": True}


async def test_tokens_per_step_chunks_the_deltas(llm):
    llm.core.tokens_per_step = 3
    outs = await outputs(llm, params([1, 2, 3, 4, 5, 6, 7]))
    assert [o.outputs[0].token_ids for o in outs] == [[1, 2, 3], [4, 5, 6], [7, IM_END]]


async def slow_reader(llm, sp: SamplingParams, pause_s: float) -> list[list[int]]:
    """The token ids of each output, for a reader that lets `pause_s` pass before taking each one."""
    seen = []
    async for out in llm.generate(tokens_input(PROMPT), sp, "slow"):
        seen.append(out.outputs[0].token_ids)
        await asyncio.sleep(pause_s)
    return seen


async def test_the_lockstep_bound_lets_a_slow_reader_get_merged_steps_and_none_waits_for_it(llm):
    # A reader the event loop does not run for longer than the bound (as on a loaded machine):
    # the bounded wait steps on and vLLM's collector merges the untaken output with the next.
    llm.core.lockstep_timeout_s = 0.02
    merged = await slow_reader(llm, params([1, 2, 3, 4]), 0.1)
    assert sum(merged, []) == [1, 2, 3, 4, IM_END] and len(merged) < 5, merged
    llm.core.lockstep_timeout_s = None
    assert await slow_reader(llm, params([1, 2, 3, 4]), 0.1) == [[1], [2], [3], [4], [IM_END]]


async def test_a_held_request_waits_and_can_be_aborted_before_its_first_token(llm):
    gate = llm.core.hold("held")
    task = asyncio.create_task(outputs(llm, params([9707]), "held"))
    await gate.reached()
    assert llm.core.waiting and llm.core.running == []
    await llm.abort("held")
    outs = await task
    assert (tokens(outs), final(outs).finish_reason) == ([], "abort")
    assert llm.core.waiting == []


async def test_a_released_request_runs(llm):
    gate = llm.core.hold("held")
    task = asyncio.create_task(outputs(llm, params([9707], FINAL), "held"))
    await gate.reached()
    gate.release()
    assert tokens(await task) == [9707, IM_END]


async def test_a_failed_request_finishes_with_error(llm):
    llm.core.fail("bad")
    outs = await outputs(llm, params([9707]), "bad")
    assert (tokens(outs), final(outs).finish_reason) == ([], "error")
    llm.core.fail("late", after_tokens=2)
    outs = await outputs(llm, params([9707, 11, 1879]), "late")
    assert (tokens(outs), final(outs).finish_reason) == ([9707, 11], "error")


async def test_a_dead_engine_fails_open_and_new_requests(llm):
    gate = llm.core.hold("open")
    task = asyncio.create_task(outputs(llm, params([9707]), "open"))
    await gate.reached()
    llm.core.die()
    with pytest.raises(EngineDeadError):
        await task
    assert llm.errored
    with pytest.raises(EngineDeadError):
        await outputs(llm, params([9707]), "new")


async def test_a_gate_after_tokens_pauses_a_running_request(llm):
    gate = llm.core.hold("paused", after_tokens=2)
    seen: list[list[int]] = []

    async def read() -> None:
        async for out in llm.generate(tokens_input(PROMPT), params([1, 2, 3, 4]), "paused"):
            seen.append(out.outputs[0].token_ids)

    task = asyncio.create_task(read())
    await gate.reached()
    await asyncio.sleep(0.05)
    assert seen == [[1], [2]] and llm.core.running
    gate.release()
    await task
    assert seen == [[1], [2], [3], [4], [IM_END]]
