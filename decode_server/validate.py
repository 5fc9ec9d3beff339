"""Every fail-loud rule for a generate request, one function each, named after what it forbids.

Each raises `errors.Rejected` with the status and a message that names the cause. The
order matters only in that cheap structural rules run before vLLM's own
SamplingParams validation, whose message is surfaced unchanged.
"""

from __future__ import annotations

from typing import Any

import msgspec
from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
from vllm.sampling_params import RequestOutputKind, SamplingParams

from decode_server.engine import EngineLimits
from decode_server.errors import Rejected
from protocol.generate import GenerateRequest


def forbid_multimodal_input(req: GenerateRequest) -> None:
    if req.features is not None or req.content_parts:
        raise Rejected("multimodal input is not supported", param="features", reason="multimodal")


def forbid_out_of_vocab_token_ids(req: GenerateRequest, limits: EngineLimits) -> None:
    # Negative ids and an empty list are already rejected by the wire decoder.
    bad = next((t for t in req.token_ids if t >= limits.vocab_size), None)
    if bad is not None:
        raise Rejected(
            f"token_ids contains {bad}, which is out of the model's vocabulary (size {limits.vocab_size})",
            param="token_ids",
            reason="token_id_out_of_vocab",
        )


def forbid_text_levels_without_tokenizer(req: GenerateRequest, limits: EngineLimits) -> None:
    if req.output_mode != "tokens" and not limits.has_tokenizer:
        raise Rejected(
            f"output_mode={req.output_mode!r} requires a tokenizer, but this server does not load one "
            "(--tokens-only or --skip-tokenizer-init). Send it to a decode server with a tokenizer, "
            "or use output_mode='tokens'.",
            param="output_mode",
            reason="no_tokenizer",
        )


def forbid_text_levels_without_detokenize(req: GenerateRequest, provided: dict[str, Any]) -> None:
    if req.output_mode != "tokens" and provided.get("detokenize") is False:
        raise Rejected(
            f"output_mode={req.output_mode!r} requires sampling_params.detokenize to be true",
            param="sampling_params.detokenize",
            reason="detokenize_false",
        )


def forbid_stop_strings_without_tokenizer(provided: dict[str, Any], limits: EngineLimits) -> None:
    if provided.get("stop") and not limits.has_tokenizer:
        raise Rejected(
            "stop strings are not supported on a --tokens-only server because detokenization is "
            "disabled; check stop strings on the coordinator, or use stop_token_ids.",
            param="sampling_params.stop",
            reason="stop_without_tokenizer",
        )


def forbid_chat_request_outside_derender(req: GenerateRequest) -> None:
    if req.chat_request is not None and req.output_mode != "derender":
        raise Rejected(
            "chat_request is only read at output_mode='derender'; drop it or set output_mode='derender'",
            param="chat_request",
            reason="chat_request_outside_derender",
        )
    if req.chat_request is not None and req.parse_context is not None:
        raise Rejected(
            "send either parse_context or chat_request, not both",
            param="parse_context",
            reason="both_parse_contexts",
        )


def forbid_n_above_max_num_seqs(n: int, limits: EngineLimits) -> None:
    if n > limits.max_num_seqs:
        raise Rejected(
            f"sampling_params.n must be at most the server's max_num_seqs ({limits.max_num_seqs}), got {n}",
            param="sampling_params.n",
            reason="n_above_max_num_seqs",
        )


def forbid_logprobs_above_server_max(sp: SamplingParams, limits: EngineLimits) -> None:
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(sp, name)
        if value is not None and value > limits.max_logprobs:
            raise Rejected(
                f"sampling_params.{name}={value} exceeds the server's max_logprobs ({limits.max_logprobs})",
                param=f"sampling_params.{name}",
                reason="logprobs_above_max",
            )


def forbid_prompt_plus_max_tokens_beyond_context(
    prompt_len: int, max_tokens: int | None, limits: EngineLimits
) -> None:
    if prompt_len >= limits.max_model_len:
        raise Rejected(
            f"the prompt has {prompt_len} tokens; this model's context length is {limits.max_model_len}, "
            "which leaves no room for output",
            param="token_ids",
            reason="prompt_too_long",
        )
    if max_tokens is not None and prompt_len + max_tokens > limits.max_model_len:
        raise Rejected(
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) = {prompt_len + max_tokens} "
            f"exceeds the model's context length ({limits.max_model_len})",
            param="sampling_params.max_tokens",
            reason="context_length_exceeded",
        )


def vllm_sampling_params(provided: dict[str, Any]) -> SamplingParams:
    """vLLM's own SamplingParams from the caller's keys; its validation message is surfaced as is."""
    try:
        return msgspec.convert(provided, SamplingParams, strict=False)
    except (msgspec.ValidationError, ValueError, TypeError) as e:
        param = getattr(e, "parameter", None)
        raise Rejected(str(e), param=f"sampling_params.{param}" if param else "sampling_params", reason="sampling_params") from e


def forbid_params_the_engine_cannot_carry(sp: SamplingParams, req: GenerateRequest) -> None:
    """The engine gets the request over msgpack; ints beyond 64 bits would fail there, as a 500."""
    try:
        msgspec.msgpack.encode((sp, req.kv_transfer_params, req.ec_transfer_params))
    except (OverflowError, TypeError, ValueError) as e:
        raise Rejected(f"sampling_params or transfer params cannot be sent to the engine: {e}", reason="unencodable") from e


def build_sampling_params(
    req: GenerateRequest,
    limits: EngineLimits,
    *,
    tokens_only: bool,
    generation_defaults: dict[str, Any],
) -> SamplingParams:
    """Run every rule and return the SamplingParams the engine will get."""
    provided = req.sampling_params.provided()
    forbid_multimodal_input(req)
    forbid_out_of_vocab_token_ids(req, limits)
    forbid_text_levels_without_tokenizer(req, limits)
    forbid_text_levels_without_detokenize(req, provided)
    forbid_stop_strings_without_tokenizer(provided, limits)
    forbid_chat_request_outside_derender(req)
    sp = vllm_sampling_params(provided)
    forbid_n_above_max_num_seqs(sp.n, limits)
    forbid_logprobs_above_server_max(sp, limits)
    prompt_len = len(req.token_ids)
    if "max_tokens" not in provided:
        # As vLLM: the model's generation config, else the room left in the context.
        sp.max_tokens = get_max_tokens(
            max_model_len=limits.max_model_len,
            max_tokens=None,
            input_length=prompt_len,
            default_sampling_params=generation_defaults,
        ) if prompt_len < limits.max_model_len else None
    forbid_prompt_plus_max_tokens_beyond_context(prompt_len, sp.max_tokens, limits)
    forbid_params_the_engine_cannot_carry(sp, req)
    if tokens_only:
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
