"""Smoke test: demo model + ReplayLogitsProcessor on a real vLLM AsyncLLM.

Run from the repo root:  python scripts/smoke_demo_replay.py [--quick]
Takes ~1.5 minutes on a 2-core CPU, mostly engine start-up (--quick skips
the second engine). Exits non-zero on failure.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import tempfile
import time
import uuid
from pathlib import Path

# The engine core runs in a spawned process; it inherits sys.path, which is
# how it finds decode_server.replay without the project being installed.
REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

REPLAY = "decode_server.replay:ReplayLogitsProcessor"
EOS = 151645
TEXT = (
    "Hello, world! 你好 😀<think>\nLet me think.\n</think>\n\n"
    '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
)


def engine_args(model_dir: Path, **overrides):
    from vllm.engine.arg_utils import AsyncEngineArgs

    from decode_server.demo_model import DEMO_MODEL_NAME

    kwargs = dict(
        model=str(model_dir),
        served_model_name=[DEMO_MODEL_NAME],
        load_format="dummy",
        max_model_len=4096,
        max_num_seqs=16,
        kv_cache_memory_bytes=256 * 1024**2,
        logits_processors=[REPLAY],
        enforce_eager=True,
    )
    kwargs.update(overrides)
    return AsyncEngineArgs(**kwargs)


async def render(engine, messages, **template_kwargs):
    """Engine-ready prompt via vLLM's own chat rendering (as the server does)."""
    from vllm.renderers.params import ChatParams

    params = ChatParams(
        chat_template_kwargs={"add_generation_prompt": True, **template_kwargs}
    )
    _, (engine_input,) = await engine.renderer.render_chat_async([messages], params)
    return engine_input


async def generate(engine, params, prompt=None):
    """Final RequestOutput of one request."""
    if prompt is None:
        prompt = await render(engine, [{"role": "user", "content": "hi"}])
    final = None
    async for out in engine.generate(prompt, params, request_id=uuid.uuid4().hex):
        final = out
    assert final is not None and final.finished
    return final


async def run_checks(engine, tokenizer) -> None:
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind

    script = tokenizer.encode(TEXT)
    assert 151667 in script and 151668 in script and 151657 in script, script

    def replay(**kw) -> SamplingParams:
        extra = {"replay_token_ids": kw.pop("script", script)}
        if "eos" in kw:
            extra["replay_eos_token_id"] = kw.pop("eos")
        kw.setdefault("max_tokens", 200)
        return SamplingParams(extra_args=extra, **kw)

    # vLLM's own chat rendering with the demo template.
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": "d",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    chat_prompt = await render(engine, messages, tools=tools, enable_thinking=False)
    chat_text = tokenizer.decode(chat_prompt["prompt_token_ids"])
    assert chat_text.startswith("<|im_start|>system\nsys\n\n# Tools"), chat_text
    assert '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>' in chat_text
    assert "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n" in chat_text
    assert chat_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), chat_text
    out = (await generate(engine, replay(), chat_prompt)).outputs[0]
    assert list(out.token_ids) == script + [EOS] and out.text == TEXT
    print("ok  chat template via vLLM renderer")

    # Greedy and random sampling both follow the script, then stop on EOS.
    for params in (replay(temperature=0.0), replay(temperature=1.0, top_p=0.9)):
        out = (await generate(engine, params)).outputs[0]
        assert list(out.token_ids) == script + [EOS], out.token_ids
        assert out.text == TEXT, repr(out.text)
        assert out.finish_reason == "stop", out.finish_reason
    print(f"ok  replay of {len(script)} tokens, text round-trips")

    # n=2: every child gets the same script. (With the default CUMULATIVE
    # output kind each yielded RequestOutput carries only the child that just
    # advanced; FINAL_ONLY aggregates all n.)
    params = replay(n=2, temperature=1.0, output_kind=RequestOutputKind.FINAL_ONLY)
    res = await generate(engine, params)
    assert len(res.outputs) == 2
    for out in res.outputs:
        assert list(out.token_ids) == script + [EOS], (out.index, out.token_ids)
        assert out.text == TEXT, repr(out.text)
    print("ok  n=2")

    # Streaming deltas add up to the same text.
    params = replay(output_kind=RequestOutputKind.DELTA)
    pieces, ids = [], []
    prompt = await render(engine, [{"role": "user", "content": "stream"}])
    async for o in engine.generate(prompt, params, request_id=uuid.uuid4().hex):
        pieces.append(o.outputs[0].text)
        ids.extend(o.outputs[0].token_ids)
    assert "".join(pieces) == TEXT and ids == script + [EOS]
    print(f"ok  streaming ({len(pieces)} deltas)")

    # ignore_eos: EOS keeps being forced until max_tokens.
    out = (
        await generate(engine, replay(ignore_eos=True, max_tokens=len(script) + 3))
    ).outputs[0]
    assert list(out.token_ids) == script + [EOS] * 3, out.token_ids
    assert out.finish_reason == "length"
    print("ok  ignore_eos")

    # Custom EOS override, empty script, a script cut short by max_tokens.
    out = (await generate(engine, replay(script=[9707], eos=151643))).outputs[0]
    assert list(out.token_ids) == [9707, 151643] and out.finish_reason == "stop"
    out = (await generate(engine, replay(script=[]))).outputs[0]
    assert list(out.token_ids) == [EOS] and out.text == "" and out.finish_reason == "stop"
    out = (await generate(engine, replay(max_tokens=3))).outputs[0]
    assert list(out.token_ids) == script[:3] and out.finish_reason == "length"
    print("ok  eos override / empty script / max_tokens")

    # A busy mixed batch, larger than max_num_seqs=16: different lengths finish
    # at different steps, so vLLM removes, refills and moves rows under the
    # processor.
    scripts = [tokenizer.encode(f"request {i}: " + "la " * (i * 3)) for i in range(20)]
    jobs = [
        generate(engine, replay(script=s, temperature=0.7, seed=i))
        for i, s in enumerate(scripts)
    ]
    jobs += [
        generate(engine, SamplingParams(max_tokens=5 + i, temperature=1.0))
        for i in range(4)
    ]
    t0 = time.monotonic()
    results = await asyncio.gather(*jobs)
    for s, res in zip(scripts, results[:20]):
        assert list(res.outputs[0].token_ids) == s + [EOS], (s, res.outputs[0].token_ids)
    for i, res in enumerate(results[20:]):
        # Unscripted requests run free (random weights => gibberish).
        assert len(res.outputs[0].token_ids) == 5 + i, res.outputs[0]
        assert res.outputs[0].finish_reason == "length"
    print(f"ok  {len(jobs)} concurrent requests ({time.monotonic() - t0:.1f}s)")

    # Logprobs under the default logprobs_mode (raw_logprobs).
    out = (await generate(engine, replay(script=script[:4], logprobs=2))).outputs[0]
    for tok, lp in zip(out.token_ids, out.logprobs):
        print(f"    token {tok}: logprob {lp[tok].logprob:.3f} rank {lp[tok].rank}")
        assert lp[tok].logprob < -1.0  # ~ -ln(vocab): dummy weights are ~uniform
    print("ok  logprobs (raw: the model's own, not the forced distribution)")

    # Malformed scripts are rejected at admission.
    for bad in ([1, -2], "abc", [1.5], [True], None):
        try:
            await generate(engine, SamplingParams(extra_args={"replay_token_ids": bad}))
        except VLLMValidationError as e:
            assert "replay_token_ids" in str(e), e
        else:
            raise AssertionError(f"accepted bad script {bad!r}")
    print("ok  malformed scripts rejected")


async def run_stress_checks(engine, tokenizer) -> None:
    """Second engine: processed logprobs and a KV cache small enough to preempt."""
    from vllm import SamplingParams

    params = SamplingParams(
        max_tokens=50, logprobs=2, extra_args={"replay_token_ids": [9707, 1879]}
    )
    out = (await generate(engine, params)).outputs[0]
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp[tok].logprob == 0.0 and lp[tok].rank == 1, lp
        assert all(v.logprob == float("-inf") for k, v in lp.items() if k != tok), lp
    print("ok  processed_logprobs: forced token 0.0, others -inf")

    # ~16 x 450 tokens against a ~5k-token KV cache forces preemption; resumed
    # requests must pick up their script where they left off.
    scripts = [tokenizer.encode(f"req {i} " + "la " * (400 + 10 * i)) for i in range(16)]
    results = await asyncio.gather(
        *(
            generate(
                engine,
                SamplingParams(
                    max_tokens=1000, temperature=1.0, extra_args={"replay_token_ids": s}
                ),
            )
            for s in scripts
        )
    )
    for s, res in zip(scripts, results):
        assert list(res.outputs[0].token_ids) == s + [EOS]
    preemptions = sum(res.metrics.num_preemptions for res in results)
    assert preemptions > 0, "no preemption happened; shrink the KV cache"
    print(f"ok  {preemptions} preemptions, all scripts intact")


async def with_engine(args, checks) -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    t0 = time.monotonic()
    engine = AsyncLLM.from_engine_args(args)
    print(f"engine up in {time.monotonic() - t0:.1f}s")
    try:
        t0 = time.monotonic()
        await checks(engine, engine.get_tokenizer())
        print(f"checks passed in {time.monotonic() - t0:.1f}s")
    finally:
        engine.shutdown()
        # Collect it now: AsyncLLM.__del__ re-runs shutdown() and fails
        # noisily if that only happens during interpreter teardown.
        del engine
        gc.collect()


async def main(quick: bool) -> None:
    from decode_server.demo_model import build_demo_model

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        model_dir = build_demo_model(Path(tmp) / "demo")
        print(f"built demo model in {time.monotonic() - t0:.1f}s: {model_dir}")

        await with_engine(engine_args(model_dir), run_checks)
        if not quick:
            stress = engine_args(
                model_dir,
                logprobs_mode="processed_logprobs",
                kv_cache_memory_bytes=5 * 1024**2 // 2,  # ~5k tokens
                disable_log_stats=False,  # fills RequestOutput.metrics
            )
            await with_engine(stress, run_stress_checks)
        print("ALL OK")


if __name__ == "__main__":
    asyncio.run(main(quick="--quick" in sys.argv[1:]))
