"""Stage 2 (text level): resolve logprobs to strings; text deltas come from the engine.

The request's own incremental detokenizer runs inside AsyncLLM's output
processor (stop strings, skip_special_tokens and held-back text included), so
this stage only turns logprobs into the chat shape. Integer logprobs for the
tokens level live here too, so each level is one stage over token steps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from decode_server.pipeline.logprobs import integer_logprobs, text_logprobs
from decode_server.pipeline.tokens import Step


async def with_integer_logprobs(steps: AsyncIterator[Step], num_top: int | None) -> AsyncIterator[Step]:
    async for step in steps:
        if num_top is not None:
            for choice in step.choices:
                choice.logprobs = integer_logprobs(choice.token_ids, choice.raw_logprobs, num_top)
        yield step


async def with_text_logprobs(steps: AsyncIterator[Step], num_top: int | None, tokenizer: Any) -> AsyncIterator[Step]:
    async for step in steps:
        if num_top is not None:
            for choice in step.choices:
                choice.logprobs = text_logprobs(choice.token_ids, choice.raw_logprobs, num_top, tokenizer)
        yield step
