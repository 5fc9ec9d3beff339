"""The SamplingParams the engine gets for a request: building only, no rules of ours.

vLLM's own SamplingParams validates the caller's keys (its message is surfaced unchanged); then
what vLLM's generate adds: max_tokens from the model when absent, the output kind, the transfer
params, and no detokenizing where nothing on the wire reads text.
"""

from __future__ import annotations

from typing import Any

import msgspec
from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind, SamplingParams

from decode_server.errors import Rejected
from decode_server.generate.modes import Mode
from decode_server.runtime.engine import EngineLimits
from protocol.generate import GenerateRequest


def sampling_params(
    req: GenerateRequest,
    provided: dict[str, Any],
    mode: Mode,
    limits: EngineLimits,
    *,
    tokens_only: bool,
    generation_defaults: dict[str, Any],
) -> SamplingParams:
    """`provided`: the caller's sampling keys (`req.sampling_params.provided()`)."""
    sp = vllm_sampling_params(provided)
    prompt_len = len(req.token_ids)
    if "max_tokens" not in provided:
        # As vLLM: the model's generation config, else the room left in the context (none left:
        # a rule refuses the prompt).
        sp.max_tokens = get_max_tokens(
            max_model_len=limits.max_model_len,
            max_tokens=None,
            input_length=prompt_len,
            default_sampling_params=generation_defaults,
        ) if prompt_len < limits.max_model_len else None
    if tokens_only or _text_is_unobservable(mode, sp):
        sp.detokenize = False
    # Streams get each engine step's delta; batch gets one final output per request
    # (as vLLM's generate), fed through the same stages.
    sp.output_kind = RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY
    extra = dict(sp.extra_args or {})
    if req.kv_transfer_params is not None:
        extra["kv_transfer_params"] = req.kv_transfer_params
    if req.ec_transfer_params is not None:
        extra["ec_transfer_params"] = req.ec_transfer_params
    if extra:
        sp.extra_args = extra
    return sp


def vllm_sampling_params(provided: dict[str, Any]) -> SamplingParams:
    """vLLM's own SamplingParams from the caller's keys; its validation message is surfaced as is."""
    provided = dict(provided)
    # vLLM's pydantic field takes nested lists for this ndarray-typed field; msgspec cannot.
    score_ids = provided.pop("prompt_logprob_token_ids", None)
    try:
        sp = msgspec.convert(provided, SamplingParams, strict=False)
        sp.prompt_logprob_token_ids = score_ids
        return sp
    except msgspec.ValidationError as e:  # a type error in the schema: vLLM's "Bad Request"
        raise Rejected(str(e), param="sampling_params", reason="sampling_params", error_type="Bad Request") from e
    except (ValueError, TypeError, VLLMValidationError) as e:  # vLLM's own checks, its message
        param = getattr(e, "parameter", None)
        raise Rejected(str(e), param=f"sampling_params.{param}" if param else "sampling_params", reason="sampling_params") from e


def _text_is_unobservable(mode: Mode, sp: SamplingParams) -> bool:
    """Where the wire reads no text, the engine's incremental detokenizer is needed only to match
    stop strings or to decode prompt logprobs: otherwise skip that per-token work."""
    return not mode.needs_text and not sp.stop and sp.prompt_logprobs is None
