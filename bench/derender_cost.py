"""What the derender stage costs per token, without an engine or HTTP: CPU seconds of the stage alone.

One 1,024-token qwen3 + hermes answer (reasoning, content, tool calls: every parser branch) is cut
into the DELTA outputs vLLM's output processor sends at a stream interval (its own incremental
detokenizer makes the text, the stop buffer holds text back when a stop string is given). Each run
drives `token_steps` → `derender_stream` over them, as the generate service does for one stream;
the same run of `token_steps` alone is subtracted, so what is left is the derender stage (the
parser, the wire deltas and any per-token splitting). Variants run interleaved; median and
[min–max] of the CPU microseconds per token:

    python -m bench.derender_cost --repeat 7
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.tokenizers import get_tokenizer
from vllm.v1.engine.detokenizer import IncrementalDetokenizer

from decode_server.config import DerenderConfig
from decode_server.generate.pipeline.derender import derender_stream
from decode_server.generate.pipeline.derender_plan import Derenderer
from decode_server.generate.pipeline.tokens import token_steps
from decode_server.tools.demo_model import ensure_demo_model

TOKENS = 1024
PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
EOS = 151645
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
VARIANTS = {  # name -> (stream interval, stop strings)
    "interval1": (1, None),
    "interval8": (8, None),
    "interval1-stop": (1, ["never-in-the-output"]),
    "interval8-stop": (8, ["never-in-the-output"]),
}


def _answer(tokenizer: Any) -> list[int]:
    """TOKENS ids: a think block, content and hermes calls, then EOS."""
    reasoning = " ".join(f"Step {i}: weigh the weather in city number {i} — carefully." for i in range(60))
    content = " ".join(f"Paris is sunny at {i} o'clock, Zürich is not." for i in range(40))
    call = "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": {"city": 'Zürich "Altstadt" 東京'}}) + "\n</tool_call>"
    text = f"<think>\n{reasoning}\n</think>\n\n{content}\n" + "\n".join([call] * 40)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) >= TOKENS - 1, len(ids)
    return ids[: TOKENS - 1] + [EOS]


def _outputs(tokenizer: Any, ids: list[int], sp: SamplingParams, interval: int) -> list[RequestOutput]:
    """DELTA outputs as the engine's output processor makes them at `interval` (first token alone)."""
    request = SimpleNamespace(request_id="r", prompt_token_ids=PROMPT, prompt_embeds=None, sampling_params=sp)
    detok = IncrementalDetokenizer.from_new_request(tokenizer, request)
    outputs, start = [], 0
    cuts = [1, *range(1 + interval, len(ids), interval), len(ids)]
    for end in cuts:
        for i in range(start, end):
            detok.update([ids[i]], ids[i] == EOS)
        finished = end == len(ids)
        text = detok.get_next_output_text(finished, delta=True)
        out = CompletionOutput(0, text, ids[start:end], None, None, finish_reason="stop" if finished else None)
        outputs.append(RequestOutput("r", None, PROMPT, None, [out], finished))
        start = end
    return outputs


async def _aiter(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def _drain(steps: AsyncIterator[Any]) -> int:
    n = 0
    async for step in steps:
        n += len(step.choices)
    return n


def _cpu(run: Any) -> float:
    start = time.process_time()
    asyncio.run(run())
    return time.process_time() - start


def measure(derenderer: Derenderer, outputs: list[RequestOutput], sp: SamplingParams, rounds: int) -> float:
    """CPU µs per token of the derender stage (token_steps alone subtracted)."""
    ctx = {"tools": [WEATHER], "tool_choice": "auto"}

    async def both() -> None:
        for _ in range(rounds):
            plan = derenderer.plan(ctx, None)
            await _drain(derender_stream(token_steps(_aiter(outputs), keep_text_only=True), plan, PROMPT, sp))

    async def steps_only() -> None:
        for _ in range(rounds):
            derenderer.plan(ctx, None)
            await _drain(token_steps(_aiter(outputs), keep_text_only=True))

    return (_cpu(both) - _cpu(steps_only)) / (rounds * TOKENS) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=5, help="streams per measurement")
    args = ap.parse_args()
    model = ensure_demo_model()
    tokenizer = get_tokenizer(str(model))
    config = DerenderConfig(reasoning_parser="qwen3", tool_call_parser="hermes", enable_auto_tool_choice=True)
    derenderer = Derenderer(config, tokenizer, SimpleNamespace(model=str(model), hf_config=SimpleNamespace(model_type="qwen3")))
    ids = _answer(tokenizer)
    cases = {}
    for name, (interval, stop) in VARIANTS.items():
        sp = SamplingParams(stop=stop)
        cases[name] = (_outputs(tokenizer, ids, sp, interval), sp)
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    measure(derenderer, *cases["interval1"], 1)  # warm-up: imports, caches
    for _ in range(args.repeat):
        for name, (outputs, sp) in cases.items():
            results[name].append(measure(derenderer, outputs, sp, args.rounds))
    print(f"derender stage, CPU µs per token ({TOKENS} tokens, qwen3 + hermes, median [min–max] of {args.repeat}):")
    for name, values in results.items():
        print(f"  {name:16s} {statistics.median(values):7.1f}  [{min(values):.1f}–{max(values):.1f}]")


if __name__ == "__main__":
    main()
