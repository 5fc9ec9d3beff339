"""Steps → wire objects: one stream chunk per choice update, or the batch response folded from them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from vllm.entrypoints.generate.base.serving import clamp_prompt_logprobs

from decode_server.pipeline.tokens import ChoiceStep, Step
from protocol.chat import ChatLogProbs, ChatMessage
from protocol.generate import (
    DerenderChoice,
    DerenderStreamChoice,
    FinalStreamUsage,
    GenerateDerenderResponse,
    GenerateDerenderStreamResponse,
    GenerateLogProbs,
    GenerateTextResponse,
    GenerateTextStreamResponse,
    GenerateTokensResponse,
    GenerateTokensStreamResponse,
    TextChoice,
    TextStreamChoice,
    TokensChoice,
    TokensStreamChoice,
    Usage,
    UsageChunk,
)


@dataclass(frozen=True, slots=True)
class ResponseContext:
    request_id: str
    model: str
    output_mode: str
    n: int
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False


@dataclass(slots=True)
class StreamStats:
    """What the caller (metrics, access log) learns from a stream as it runs."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    finish_reasons: list[str] = field(default_factory=list)


def _usage(prompt_tokens: int, completion_tokens: int, cls: type = Usage) -> Any:
    return cls(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens + completion_tokens, completion_tokens=completion_tokens)


def _stream_chunk(ctx: ResponseContext, c: ChoiceStep) -> Any:
    common = dict(
        index=c.index,
        finish_reason=c.finish_reason,
        stop_reason=c.stop_reason,
        token_ids=None if c.hide_metadata else c.token_ids,
        **c.extras,
    )
    if c.hide_metadata:
        c.logprobs = None
    if ctx.output_mode == "tokens":
        return GenerateTokensStreamResponse(
            request_id=ctx.request_id, usage=None, output_mode="tokens", choices=[TokensStreamChoice(logprobs=c.logprobs, **common)]
        )
    if ctx.output_mode == "text":
        return GenerateTextStreamResponse(
            request_id=ctx.request_id,
            usage=None,
            output_mode="text",
            choices=[TextStreamChoice(text=c.text, logprobs=c.logprobs, **common)],
        )
    return GenerateDerenderStreamResponse(
        request_id=ctx.request_id,
        usage=None,
        output_mode="derender",
        choices=[DerenderStreamChoice(delta=c.delta, logprobs=c.logprobs, **common)],
    )


async def stream_chunks(ctx: ResponseContext, steps: AsyncIterator[Step], stats: StreamStats) -> AsyncIterator[Any]:
    generated = [0] * ctx.n
    prompt_ids: list[int] | None = None
    first = True
    async for step in steps:
        out = step.output
        if first:
            first = False
            stats.prompt_tokens = len(out.prompt_token_ids or ())
            if ctx.return_token_ids:
                prompt_ids = list(out.prompt_token_ids or ())
        for c in step.choices:
            generated[c.index] += len(c.token_ids)
            stats.completion_tokens += len(c.token_ids)
            if stats.first_token_at is None and c.token_ids:
                stats.first_token_at = time.monotonic()
            if c.finish_reason is not None:
                stats.finish_reasons.append(c.finish_reason)
            chunk = _stream_chunk(ctx, c)
            if prompt_ids is not None:
                chunk.prompt_token_ids = prompt_ids
                prompt_ids = None
            if ctx.continuous_usage:
                chunk.usage = _usage(stats.prompt_tokens, generated[c.index])
            yield chunk
    if ctx.include_usage:
        yield UsageChunk(
            request_id=ctx.request_id,
            usage=_usage(stats.prompt_tokens, sum(generated), FinalStreamUsage),
            output_mode=ctx.output_mode,
            choices=[],
        )


@dataclass(slots=True)
class _ChoiceFold:
    index: int
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    logprobs: list[Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    message: ChatMessage | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    hide_metadata: bool = False

    def add(self, c: ChoiceStep) -> None:
        self.token_ids.extend(c.token_ids)
        self.extras.update(c.extras)
        self.hide_metadata |= c.hide_metadata
        if c.text:
            self.text.append(c.text)
        if c.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(c.logprobs.content or ())
        if c.finish_reason is not None:
            self.finish_reason = c.finish_reason
            self.stop_reason = c.stop_reason
        if c.message is not None:
            self.message = c.message


def _batch_choice(ctx: ResponseContext, f: _ChoiceFold) -> Any:
    common = dict(
        index=f.index,
        finish_reason=f.finish_reason or "stop",
        stop_reason=f.stop_reason,
        token_ids=None if f.hide_metadata else f.token_ids,
        **f.extras,
    )
    if f.hide_metadata:
        f.logprobs = None
    if ctx.output_mode == "tokens":
        logprobs = None if f.logprobs is None else GenerateLogProbs(content=f.logprobs)
        return TokensChoice(logprobs=logprobs, **common)
    logprobs = None if f.logprobs is None else ChatLogProbs(content=f.logprobs)
    if ctx.output_mode == "text":
        return TextChoice(text="".join(f.text), logprobs=logprobs, **common)
    return DerenderChoice(message=f.message, logprobs=logprobs, **common)


_BATCH_TYPES = {
    "tokens": GenerateTokensResponse,
    "text": GenerateTextResponse,
    "derender": GenerateDerenderResponse,
}


async def fold_response(ctx: ResponseContext, steps: AsyncIterator[Step], stats: StreamStats) -> Any:
    folds = [_ChoiceFold(i) for i in range(ctx.n)]
    first = last = None
    async for step in steps:
        if first is None:
            first = step.output
        last = step.output
        for c in step.choices:
            if stats.first_token_at is None and c.token_ids:
                stats.first_token_at = time.monotonic()
            folds[c.index].add(c)
    assert first is not None and last is not None, "the engine ended a request without any output"
    stats.prompt_tokens = len(first.prompt_token_ids or ())
    stats.completion_tokens = sum(len(f.token_ids) for f in folds)
    stats.finish_reasons = [f.finish_reason or "stop" for f in folds]
    return _BATCH_TYPES[ctx.output_mode](
        request_id=ctx.request_id,
        model=ctx.model,
        created=int(time.time()),
        usage=_usage(stats.prompt_tokens, stats.completion_tokens),
        prompt_logprobs=clamp_prompt_logprobs(first.prompt_logprobs),
        prompt_token_ids=list(first.prompt_token_ids or ()) if ctx.return_token_ids else None,
        kv_transfer_params=last.kv_transfer_params,
        ec_transfer_params=getattr(last, "ec_transfer_params", None),
        choices=[_batch_choice(ctx, f) for f in folds],
    )
