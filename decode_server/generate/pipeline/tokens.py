"""Stage 1: engine RequestOutputs → typed steps, one ChoiceStep per choice that changed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from vllm.outputs import RequestOutput
from vllm.utils.serial_utils import numpy2base64

from decode_server.errors import EngineGenerationError
from decode_server.generate.pipeline.steps import ChoiceStep, Step


def _passthrough(out: Any) -> dict[str, Any]:
    extras: dict[str, Any] = {}
    if out.routed_experts is not None:
        extras["routed_experts"] = numpy2base64(out.routed_experts)
    if out.sampling_mask is not None:
        extras["sampling_mask"] = out.sampling_mask.token_ids
    if out.weight_versions is not None:
        extras["weight_versions"] = out.weight_versions
    return extras


async def token_steps(outputs: AsyncIterator[RequestOutput], *, keep_text_only: bool) -> AsyncIterator[Step]:
    """One Step per engine output (`to_step` over an async source: the batch path and tests)."""
    async for output in outputs:
        yield to_step(output, keep_text_only)


def to_step(output: RequestOutput, keep_text_only: bool) -> Step:
    """The Step of one engine output.

    A choice is kept when it has new token ids or a finish reason (so an abort
    always reaches the client), or, with `keep_text_only`, new text alone (text
    held back for stop-string matching is flushed without new ids).
    """
    step = Step(output)
    for out in output.outputs:
        if out.finish_reason == "error":
            raise EngineGenerationError("Internal server error")
        token_ids = out.token_ids
        if not (token_ids or out.finish_reason is not None or (keep_text_only and out.text)):
            continue
        step.choices.append(
            ChoiceStep(
                index=out.index,
                token_ids=list(token_ids),
                num_tokens=len(token_ids),
                finish_reason=out.finish_reason,
                stop_reason=out.stop_reason,
                text=out.text,
                raw_logprobs=out.logprobs,
                extras=_passthrough(out),
            )
        )
    return step
