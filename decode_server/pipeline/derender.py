"""Stage 3 (derender level): one vLLM Parser per choice → assistant message / deltas."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from decode_server.pipeline.tokens import Step
from decode_server.validate import Rejected


@dataclass(frozen=True)
class DerenderConfig:
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False


def plan_derender(req: Any, config: DerenderConfig, tokenizer: Any) -> Any:
    raise Rejected("output_mode='derender' is not available yet", reason="derender_unavailable")


async def derender_steps(steps: AsyncIterator[Step], plan: Any, prompt_token_ids: list[int], n: int) -> AsyncIterator[Step]:
    async for step in steps:
        yield step
