"""Stage 4, the wire: steps → protocol objects (one chunk per choice update, or the batch body).

The step types and the per-mode classes are read, never mutated: whatever a stage
withheld is already None on the step.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from vllm.entrypoints.generate.base.serving import clamp_prompt_logprobs

from decode_server.generate.pipeline.steps import ChoiceStep, Step
from protocol.generate import MODE_TYPES, FinalStreamUsage, PromptTokenUsage, Usage, UsageChunk


@dataclass(frozen=True, slots=True)
class WireContext:
    request_id: str
    model: str
    output_mode: str
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False
    prompt_tokens_details: bool = False  # --enable-prompt-tokens-details: cached tokens in usage


@dataclass(slots=True)
class RequestStats:
    """What metrics and the access line learn from a request as it runs."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None  # time.monotonic()
    finish_reasons: list[str] = field(default_factory=list)
    cached_tokens: int | None = None  # prefix-cache hits, as the engine reports them


def _usage(prompt_tokens: int, completion_tokens: int, cls: type = Usage, cached: int | None = None) -> Any:
    usage = cls(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens + completion_tokens, completion_tokens=completion_tokens)
    if cached is not None:
        usage.prompt_tokens_details = PromptTokenUsage(cached_tokens=cached)
    return usage


def _mode_fields(mode: str, c: ChoiceStep, batch: bool) -> dict[str, Any]:
    if mode == "tokens":
        return {}
    if mode == "text":
        return {"text": c.text}
    return {"message": c.message} if batch else {"delta": c.delta}


def _choice(mode: str, cls: type, c: ChoiceStep, *, batch: bool) -> Any:
    return cls(
        index=c.index,
        finish_reason=(c.finish_reason or "stop") if batch else c.finish_reason,
        stop_reason=c.stop_reason,
        token_ids=c.token_ids,
        logprobs=c.logprobs,
        **_mode_fields(mode, c, batch),
        **c.extras,
    )


async def stream_chunks(ctx: WireContext, steps: AsyncIterator[Step], stats: RequestStats) -> AsyncIterator[Any]:
    types = MODE_TYPES[ctx.output_mode]
    generated: dict[int, int] = {}
    prompt_ids: list[int] | None = None
    first = True
    async for step in steps:
        if first:
            first = False
            stats.prompt_tokens = len(step.output.prompt_token_ids or ())
            if ctx.prompt_tokens_details:
                stats.cached_tokens = step.output.num_cached_tokens
            if ctx.return_token_ids:
                prompt_ids = list(step.output.prompt_token_ids or ())
        for c in step.choices:
            generated[c.index] = generated.get(c.index, 0) + c.num_tokens
            stats.completion_tokens += c.num_tokens
            if stats.first_token_at is None and c.num_tokens:
                stats.first_token_at = time.monotonic()
            if c.finish_reason is not None:
                stats.finish_reasons.append(c.finish_reason)
            if not c.emit:
                continue
            chunk = types.chunk(
                request_id=ctx.request_id,
                usage=_usage(stats.prompt_tokens, generated[c.index]) if ctx.continuous_usage else None,
                output_mode=ctx.output_mode,
                choices=[_choice(ctx.output_mode, types.stream_choice, c, batch=False)],
            )
            if prompt_ids is not None:
                chunk.prompt_token_ids, prompt_ids = prompt_ids, None
            yield chunk
    if ctx.include_usage:
        yield UsageChunk(
            request_id=ctx.request_id,
            usage=_usage(stats.prompt_tokens, sum(generated.values()), FinalStreamUsage, stats.cached_tokens),
            output_mode=ctx.output_mode,
            choices=[],
        )


async def batch_response(ctx: WireContext, steps: AsyncIterator[Step], stats: RequestStats) -> Any:
    """The body from the final step (the engine runs batch requests FINAL_ONLY: one step)."""
    final: Step | None = None
    choices: dict[int, ChoiceStep] = {}
    async for step in steps:
        final = step
        for c in step.choices:
            choices[c.index] = c
    assert final is not None, "the engine ended a request without any output"
    out = final.output
    ordered = [choices[i] for i in sorted(choices)]
    stats.prompt_tokens = len(out.prompt_token_ids or ())
    stats.completion_tokens = sum(c.num_tokens for c in ordered)
    stats.finish_reasons = [c.finish_reason or "stop" for c in ordered]
    stats.first_token_at = _first_token_at(out) if stats.completion_tokens else None
    if ctx.prompt_tokens_details:
        stats.cached_tokens = out.num_cached_tokens
    types = MODE_TYPES[ctx.output_mode]
    return types.response(
        request_id=ctx.request_id,
        model=ctx.model,
        created=int(time.time()),
        usage=_usage(stats.prompt_tokens, stats.completion_tokens, cached=stats.cached_tokens),
        prompt_logprobs=clamp_prompt_logprobs(out.prompt_logprobs),
        prompt_token_ids=list(out.prompt_token_ids or ()) if ctx.return_token_ids else None,
        kv_transfer_params=out.kv_transfer_params,
        ec_transfer_params=getattr(out, "ec_transfer_params", None),
        choices=[_choice(ctx.output_mode, types.choice, c, batch=True) for c in ordered],
    )


def _first_token_at(out: Any) -> float:
    """When the first token came, on the monotonic clock: the engine's own record where it keeps
    one (a FINAL_ONLY request reaches us only at the end), else now."""
    now = time.monotonic()
    stats = getattr(out, "metrics", None)
    latency = getattr(stats, "first_token_latency", 0.0)
    arrival = getattr(stats, "arrival_time", 0.0)
    if not latency or not arrival:
        return now
    return now - max(0.0, time.time() - (arrival + latency))
