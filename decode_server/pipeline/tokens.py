"""Stage 1: engine RequestOutputs → per-choice token steps (+ integer logprobs)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from vllm.outputs import RequestOutput
from vllm.utils.serial_utils import numpy2base64


class EngineGenerationError(Exception):
    """The engine finished a choice with finish_reason "error"."""


@dataclass(slots=True)
class ChoiceStep:
    """What one engine output added to one choice; later stages fill the rest."""

    index: int
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None
    text: str
    raw_logprobs: Any  # the engine's per-position {token_id: Logprob} list, or None
    extras: dict[str, Any]  # routed_experts / sampling_mask / weight_versions, passed through
    logprobs: Any = None  # wire logprobs, set by the level's stage
    delta: Any = None  # DeltaMessage, set by the derender stage
    message: Any = None  # ChatMessage, set by the derender stage on the finishing step
    hide_metadata: bool = False  # token ids and logprobs withheld (include_reasoning=false)


@dataclass(slots=True)
class Step:
    output: RequestOutput
    choices: list[ChoiceStep] = field(default_factory=list)


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
    """One Step per engine output.

    A choice is kept when it has new token ids or a finish reason (so an abort
    always reaches the client), or, with `keep_text_only`, new text alone (text
    held back for stop-string matching is flushed without new ids).
    """
    async for output in outputs:
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
                    finish_reason=out.finish_reason,
                    stop_reason=out.stop_reason,
                    text=out.text,
                    raw_logprobs=out.logprobs,
                    extras=_passthrough(out),
                )
            )
        yield step
