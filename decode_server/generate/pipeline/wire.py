"""The wire, last stage: steps → protocol objects (one chunk per choice update, or the batch body).

The step types and the per-mode classes are read, never mutated: whatever a stage
withheld is already None on the step. The counts (usage) are the stats stage's, read here.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from vllm.entrypoints.generate.base.serving import clamp_prompt_logprobs

from decode_server.generate.pipeline.steps import ChoiceStep, Step
from decode_server.runtime.request_record import RequestStats
from protocol.generate import FinalStreamUsage, ModeTypes, PromptTokenUsage, Usage, UsageChunk


class WireMode(Protocol):
    """What the wire reads of an output mode (its record in `generate/modes.py`)."""

    @property
    def name(self) -> str: ...

    @property
    def types(self) -> ModeTypes: ...

    @property
    def fields(self) -> Callable[[ChoiceStep, bool], dict[str, Any]]: ...  # (choice, batch) → its fields


@dataclass(frozen=True, slots=True)
class WireContext:
    request_id: str
    model: str
    mode: WireMode
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False
    prompt_tokens_details: bool = False  # --enable-prompt-tokens-details: cached tokens in usage


def _usage(prompt_tokens: int, completion_tokens: int, cls: type = Usage, cached: int | None = None) -> Any:
    usage = cls(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens + completion_tokens, completion_tokens=completion_tokens)
    if cached is not None:
        usage.prompt_tokens_details = PromptTokenUsage(cached_tokens=cached)
    return usage


def _choice(mode: WireMode, cls: type, c: ChoiceStep, *, batch: bool) -> Any:
    return cls(
        index=c.index,
        finish_reason=(c.finish_reason or "stop") if batch else c.finish_reason,
        stop_reason=c.stop_reason,
        token_ids=c.token_ids,
        logprobs=c.logprobs,
        **mode.fields(c, batch),
        **c.extras,
    )


def _cached(ctx: WireContext, stats: RequestStats) -> int | None:
    return stats.cached_tokens if ctx.prompt_tokens_details else None


async def stream_chunks(ctx: WireContext, steps: AsyncIterator[Step], stats: RequestStats) -> AsyncIterator[Any]:
    """`StreamWire` over an async source (tests)."""
    wire = StreamWire(ctx, stats)
    async for step in steps:
        for chunk in wire.chunks(step):
            yield chunk
    for chunk in wire.tail():
        yield chunk


class StreamWire:
    """One stream's wire: a step's chunks (one per choice update), then the tail (the usage chunk)."""

    __slots__ = ("ctx", "stats", "_first", "_prompt_ids")

    def __init__(self, ctx: WireContext, stats: RequestStats):
        self.ctx, self.stats, self._first = ctx, stats, True
        self._prompt_ids: list[int] | None = None  # the prompt's ids ride on the stream's first chunk

    def chunks(self, step: Step) -> list[Any]:
        ctx, stats = self.ctx, self.stats
        mode = ctx.mode
        types = mode.types
        if self._first:
            self._first = False
            if ctx.return_token_ids:
                self._prompt_ids = list(step.output.prompt_token_ids or ())
        out = []
        for c in step.choices:
            if not c.emit:
                continue
            chunk = types.chunk(
                request_id=ctx.request_id,
                usage=_usage(stats.prompt_tokens, stats.choice_tokens[c.index]) if ctx.continuous_usage else None,
                output_mode=mode.name,
                choices=[_choice(mode, types.stream_choice, c, batch=False)],
            )
            if self._prompt_ids is not None:
                chunk.prompt_token_ids, self._prompt_ids = self._prompt_ids, None
            out.append(chunk)
        return out

    def tail(self) -> list[Any]:
        ctx, stats = self.ctx, self.stats
        if not ctx.include_usage:
            return []
        usage = _usage(stats.prompt_tokens, stats.completion_tokens, FinalStreamUsage, _cached(ctx, stats))
        return [UsageChunk(request_id=ctx.request_id, usage=usage, output_mode=ctx.mode.name, choices=[])]


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
    mode = ctx.mode
    return mode.types.response(
        request_id=ctx.request_id,
        model=ctx.model,
        created=int(time.time()),
        usage=_usage(stats.prompt_tokens, stats.completion_tokens, cached=_cached(ctx, stats)),
        prompt_logprobs=clamp_prompt_logprobs(out.prompt_logprobs),
        prompt_token_ids=list(out.prompt_token_ids or ()) if ctx.return_token_ids else None,
        kv_transfer_params=out.kv_transfer_params,
        ec_transfer_params=getattr(out, "ec_transfer_params", None),
        choices=[_choice(mode, mode.types.choice, choices[i], batch=True) for i in sorted(choices)],
    )
