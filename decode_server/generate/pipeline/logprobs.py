"""Stage 2: the engine's per-position logprob maps in the wire shape of the level.

Three forms, one per output mode's record: integer ids (tokens level, vLLM's GenerateLogProbs),
decoded strings with UTF-8 bytes (text level, OpenAI chat shape, the running vLLM generate's top-k cut), and
the same under coupled chat's top-k cut (derender level). Token strings come from vLLM's own
resolution (`_logprob_token`: the engine's decoded_token, else the tokenizer), so they match
vLLM's text mode byte for byte. A form stacks its stage only when the request asked for logprobs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from vllm.entrypoints.scale_out.token_in_token_out.serving import _clamp_logprob, _logprob_token
from vllm.sampling_params import SamplingParams

from decode_server.compat import TOP_LOGPROBS_CUT
from decode_server.generate.pipeline.steps import Step, each
from protocol.chat import ChatLogProb, ChatLogProbs, ChatLogProbsContent
from protocol.generate import GenerateLogProb, GenerateLogProbs, GenerateLogProbsContent


def _top_count(num_top: int, available: int) -> int:
    # As the running vLLM's generate cuts (0.32: max(k, 1), the sampled token first; 0.33: none).
    return TOP_LOGPROBS_CUT(num_top, available)


def chat_top_count(num_top: int | None, return_all: bool) -> Callable[[int, int], int]:
    """Coupled chat's cut (the derender level): exactly `top_logprobs` entries (0 is none), all for
    -1 or when `logprob_token_ids` asked for specific ids."""
    def count(_: int, available: int) -> int:
        if return_all or num_top == -1:
            return available
        return min(available, num_top or 0)

    return count


def integer_logprobs(token_ids: list[int], positions: Any, num_top: int) -> GenerateLogProbs:
    content = []
    for token_id, top in zip(token_ids, positions):
        sampled = None if top is None else top.get(token_id)
        if sampled is None:
            content.append(GenerateLogProbsContent(token_id=token_id, logprob=-9999.0))
            continue
        items = list(top.items())[: _top_count(num_top, len(top))]
        content.append(
            GenerateLogProbsContent(
                token_id=token_id,
                logprob=_clamp_logprob(sampled.logprob),
                rank=sampled.rank or None,
                top_logprobs=[
                    GenerateLogProb(token_id=tid, logprob=_clamp_logprob(lp.logprob), rank=lp.rank or None)
                    for tid, lp in items
                ],
            )
        )
    return GenerateLogProbs(content=content)


def text_logprobs(
    token_ids: list[int], positions: Any, num_top: int, tokenizer: Any, cut: Callable[[int, int], int] = _top_count
) -> ChatLogProbs:
    content = []
    for token_id, top in zip(token_ids, positions):
        sampled = None if top is None else top.get(token_id)
        if sampled is None:
            token, token_bytes = _logprob_token(token_id, None, tokenizer)
            content.append(ChatLogProbsContent(token=token, bytes=token_bytes))
            continue
        token, token_bytes = _logprob_token(token_id, sampled, tokenizer)
        top_entries = []
        for tid, lp in list(top.items())[: cut(num_top, len(top))]:
            top_token, top_bytes = _logprob_token(tid, lp, tokenizer)
            top_entries.append(ChatLogProb(token=top_token, logprob=_clamp_logprob(lp.logprob), bytes=top_bytes))
        content.append(
            ChatLogProbsContent(
                token=token, logprob=_clamp_logprob(sampled.logprob), bytes=token_bytes, top_logprobs=top_entries
            )
        )
    return ChatLogProbs(content=content)


def add_integer_logprobs(step: Step, num_top: int) -> None:
    for choice in step.choices:
        choice.logprobs = integer_logprobs(choice.token_ids or [], choice.raw_logprobs or [], num_top)


def add_text_logprobs(step: Step, num_top: int, tokenizer: Any, cut: Callable[[int, int], int] = _top_count) -> None:
    for choice in step.choices:
        choice.logprobs = text_logprobs(choice.token_ids or [], choice.raw_logprobs or [], num_top, tokenizer, cut)


def with_integer_logprobs(steps: AsyncIterator[Step], num_top: int) -> AsyncIterator[Step]:
    return each(steps, lambda step: add_integer_logprobs(step, num_top))


# ------------------------------------------------------------------ the forms (sp, tokenizer) → a per-step stage or None

StepStage = Callable[[Step], None]  # one engine step's Step, enriched in place
LogprobForm = Callable[[SamplingParams, Any], StepStage | None]


def integer_form(sp: SamplingParams, tokenizer: Any) -> StepStage | None:
    num_top = sp.logprobs
    return None if num_top is None else lambda step: add_integer_logprobs(step, num_top)


def text_form(sp: SamplingParams, tokenizer: Any) -> StepStage | None:
    num_top = sp.logprobs
    return None if num_top is None else lambda step: add_text_logprobs(step, num_top, tokenizer)


def chat_form(sp: SamplingParams, tokenizer: Any) -> StepStage | None:
    """As coupled chat answers: its top-k cut, also for `logprob_token_ids` alone."""
    if sp.logprobs is None and not sp.logprob_token_ids:
        return None
    num_top, cut = sp.logprobs, chat_top_count(sp.logprobs, bool(sp.logprob_token_ids))
    return lambda step: add_text_logprobs(step, num_top, tokenizer, cut)
