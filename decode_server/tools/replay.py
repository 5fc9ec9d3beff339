"""Scripted generation for tests: make vLLM emit a given token sequence.

Enable with the engine arg
``logits_processors=["decode_server.tools.replay:ReplayLogitsProcessor"]`` and
send requests with ``SamplingParams(extra_args={"replay_token_ids": [...]})``.
Output position ``i`` is forced to ``replay_token_ids[i]``; once the script
is used up the processor forces EOS, so the request finishes with
``finish_reason == "stop"`` (or, with ``ignore_eos``, keeps emitting EOS
until ``max_tokens``). Requests without the key are left alone.

Forcing works by masking every other logit to -inf, which overrides
temperature, top-k/p, penalties, logit bias, bad words, min_tokens and
structured output: all of those run before this processor or cannot revive
a -inf logit. Stop conditions still apply, so a script containing an EOS or
stop token id ends the request there.

Logprobs: with vLLM's default ``logprobs_mode="raw_logprobs"`` the reported
logprobs come from the model's logits *before* any logits processor, so they
describe what the model wanted, not the forced choice (the forced token's
logprob and rank are whatever the model gave it). With
``logprobs_mode="processed_logprobs"`` the forced token gets logprob 0.0 and
every other token -inf.

This is the V1 model runner interface. vLLM's Model Runner V2 (the default
on CUDA when Triton is available) rejects V1 processors at startup; set
``VLLM_USE_V2_MODEL_RUNNER=0`` there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from vllm import SamplingParams
from vllm.utils.torch_utils import async_tensor_h2d
from vllm.v1.sample.logits_processor import (
    BatchUpdate,
    LogitsProcessor,
    process_dict_updates,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger(__name__)

SCRIPT_KEY = "replay_token_ids"
EOS_KEY = "replay_eos_token_id"
FALLBACK_EOS_TOKEN_ID = 151645  # Qwen's <|im_end|>

# (script, eos_token_id, live output token list of the request)
_ReplayState = tuple[list[int], int, Sequence[int]]


def _is_token_id(value: Any) -> bool:
    # bool is an int subclass; True is never meant as token id 1.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse(params: SamplingParams) -> tuple[list[int], int | None] | None:
    """The request's (script, eos override), or None if it has no script."""
    args = params.extra_args or {}
    if SCRIPT_KEY not in args:
        return None
    script = args[SCRIPT_KEY]
    if not isinstance(script, (list, tuple)) or not all(map(_is_token_id, script)):
        raise ValueError(
            f"extra_args[{SCRIPT_KEY!r}] must be a list of non-negative int "
            f"token ids, got {script!r:.200}"
        )
    eos = args.get(EOS_KEY)
    if eos is not None and not _is_token_id(eos):
        raise ValueError(
            f"extra_args[{EOS_KEY!r}] must be a non-negative int token id, "
            f"got {eos!r:.200}"
        )
    return list(script), eos


def _model_eos_token_id(vllm_config: VllmConfig) -> int:
    model_config = vllm_config.model_config
    candidates: list[Any] = []
    try:
        candidates.append(model_config.try_get_generation_config().get("eos_token_id"))
    except Exception:  # a missing/odd generation config is not our problem
        pass
    candidates.append(getattr(model_config.hf_text_config, "eos_token_id", None))
    for eos in candidates:
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        if _is_token_id(eos):
            return eos
    return FALLBACK_EOS_TOKEN_ID


class ReplayLogitsProcessor(LogitsProcessor):
    """Forces each scripted request's output to follow its token script."""

    def __init__(
        self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool
    ) -> None:
        self.device = device
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        self.default_eos = _model_eos_token_id(vllm_config)
        # Keyed by persistent-batch row; only scripted requests are present.
        self.states: dict[int, _ReplayState] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        _parse(sampling_params)

    def is_argmax_invariant(self) -> bool:
        # Must run before greedy argmax, or temperature=0 requests ignore it.
        return False

    def _new_state(
        self,
        params: SamplingParams,
        _prompt_tok_ids: list[int] | None,
        output_tok_ids: list[int],
    ) -> _ReplayState | None:
        parsed = _parse(params)
        if parsed is None:
            return None
        script, eos = parsed
        if eos is None:
            # The id vLLM itself stops on (unset when ignore_eos is on).
            eos = params.eos_token_id
        if eos is None:
            eos = self.default_eos
        # validate_params cannot see the vocab size, and an out-of-range
        # index would crash the engine, so cut the script short instead.
        for i, tok in enumerate(script):
            if tok >= self.vocab_size:
                logger.warning(
                    "replay: token id %d >= vocab size %d; script truncated "
                    "at position %d",
                    tok,
                    self.vocab_size,
                    i,
                )
                script = script[:i]
                break
        if eos >= self.vocab_size:
            logger.warning("replay: EOS id %d out of range, using %d", eos, self.default_eos)
            eos = self.default_eos
        # output_tok_ids is the request's live list: its length is always the
        # number of tokens generated so far, including after preemption.
        return script, eos, output_tok_ids

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.states, batch_update, self._new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.states:
            return logits
        rows: list[int] = []
        forced: list[int] = []
        for row, (script, eos, output) in self.states.items():
            pos = len(output)
            rows.append(row)
            forced.append(script[pos] if pos < len(script) else eos)
        rows_t = async_tensor_h2d(rows, device=logits.device, dtype=torch.long)
        forced_t = async_tensor_h2d(forced, device=logits.device, dtype=torch.long)
        logits[rows_t] = float("-inf")
        logits[rows_t, forced_t] = 0.0
        return logits
