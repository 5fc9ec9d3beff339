"""The typed steps every pipeline stage passes on: one per engine output, one `ChoiceStep` per choice."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from vllm.logprobs import SampleLogprobs
from vllm.outputs import RequestOutput

from protocol.chat import ChatLogProbs, ChatMessage, DeltaMessage
from protocol.generate import GenerateLogProbs


@dataclass(slots=True)
class ChoiceStep:
    """What one engine output added to one choice (all of it, for a batch request)."""

    index: int
    # None once a stage withholds them (hidden reasoning); `num_tokens` still counts them.
    token_ids: list[int] | None
    num_tokens: int
    finish_reason: str | None
    stop_reason: int | str | None
    text: str
    raw_logprobs: SampleLogprobs | None  # the engine's per-position {token_id: Logprob}
    extras: dict[str, Any]  # routed_experts / sampling_mask / weight_versions, passed through
    logprobs: GenerateLogProbs | ChatLogProbs | None = None  # set by the logprobs stage
    # Set by the derender stage (stream): ours, or a parser's delta as coupled chat writes it.
    delta: DeltaMessage | dict[str, Any] | None = None
    message: ChatMessage | None = None  # set by the derender stage on a finished choice (batch)
    # False: counted (usage, metrics) but sends no chunk (a hidden reasoning step, as coupled chat).
    emit: bool = True

    def withhold_metadata(self) -> None:
        """Token ids, logprobs and the sampling mask would reveal what a stage hides (as coupled
        chat hides the first two, and 0.33's batch derender all three)."""
        self.token_ids = None
        self.logprobs = None
        self.extras.pop("sampling_mask", None)


@dataclass(slots=True)
class Step:
    output: RequestOutput
    choices: list[ChoiceStep] = field(default_factory=list)


def role_step(index: int, delta: DeltaMessage) -> ChoiceStep:
    """A choice update that carries only a delta (the derender level's opening role chunk)."""
    return ChoiceStep(
        index=index, token_ids=[], num_tokens=0, finish_reason=None, stop_reason=None, text="",
        raw_logprobs=None, extras={}, delta=delta,
    )


async def each(steps: AsyncIterator[Step], stage: Callable[[Step], None]) -> AsyncIterator[Step]:
    """A per-step stage over an async source of steps (a batch request's one step)."""
    async for step in steps:
        stage(step)
        yield step
