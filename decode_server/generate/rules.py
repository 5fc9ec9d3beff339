"""Every fail-loud rule for a generate request, one function each, named after what it forbids.

Each raises `errors.Rejected` with the status and a message that names the cause. Admission
runs them in order (`admission.py`): cheap structural rules before vLLM's own SamplingParams
validation (`sampling.py`), whose message is surfaced unchanged.
"""

from __future__ import annotations

from typing import Any

import msgspec
from vllm.entrypoints.generate.base.protocol import validate_cache_salt
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams

from decode_server.config import MAX_JSON_DEPTH, MAX_REQUEST_ID_CHARS
from decode_server.errors import Rejected
from decode_server.generate.modes import Mode
from decode_server.runtime.engine import EngineLimits
from protocol.generate import FINGERPRINT_HEADER, GenerateRequest


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


def forbid_text_levels_without_tokenizer(mode: Mode, limits: EngineLimits) -> None:
    if mode.needs_tokenizer and not limits.has_tokenizer:
        raise Rejected(
            f"output_mode={mode.name!r} requires a tokenizer, but this server does not load one "
            "(--tokens-only or --skip-tokenizer-init). Send it to a decode server with a tokenizer, "
            "or use output_mode='tokens'.",
            param="output_mode",
            reason="no_tokenizer",
        )


def forbid_text_levels_without_detokenize(mode: Mode, provided: dict[str, Any]) -> None:
    if mode.needs_text and provided.get("detokenize") is False:
        raise Rejected(
            f"output_mode={mode.name!r} requires sampling_params.detokenize to be true",
            param="sampling_params.detokenize",
            reason="detokenize_false",
            error_type="Bad Request",  # vLLM checks it in its request model's validator
        )


def forbid_stop_strings_without_tokenizer(provided: dict[str, Any], limits: EngineLimits) -> None:
    if provided.get("stop") and not limits.has_tokenizer:
        raise Rejected(
            "stop strings are not supported on a --tokens-only server because detokenization is "
            "disabled; check stop strings on the coordinator, or use stop_token_ids.",
            param="sampling_params.stop",
            reason="stop_without_tokenizer",
        )


def forbid_chat_request_outside_derender(req: GenerateRequest, mode: Mode) -> None:
    if req.chat_request is not None and not mode.reads_chat_context:
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
    if limits.max_logprobs == -1:
        return  # --max-logprobs -1: no cap (vLLM)
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(sp, name)
        if value is not None and value > limits.max_logprobs:
            raise Rejected(
                f"sampling_params.{name}={value} exceeds the server's max_logprobs ({limits.max_logprobs})",
                param=f"sampling_params.{name}",
                reason="logprobs_above_max",
            )


def forbid_prompt_without_room_for_output(prompt_len: int, limits: EngineLimits) -> None:
    # An explicit max_tokens beyond the room left is not an error (as vLLM): the engine stops
    # at the context length with finish_reason "length".
    if prompt_len >= limits.max_model_len:
        raise Rejected(
            f"the prompt has {prompt_len} tokens; this model's context length is {limits.max_model_len}, "
            "which leaves no room for output",
            param="token_ids",
            reason="prompt_too_long",
        )


def forbid_invalid_cache_salt(cache_salt: Any) -> None:
    """vLLM's own rule (a non-empty string, length, no path characters), with its message."""
    try:
        validate_cache_salt(cache_salt)
    except VLLMValidationError as e:
        raise Rejected(str(e), param="cache_salt", reason="invalid_cache_salt") from e


def forbid_invalid_raw_cache_salt(body: bytes) -> None:
    """On a body that failed the schema: vLLM names a bad cache_salt first (a before-validator)."""
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return
    if isinstance(raw, dict) and "cache_salt" in raw:
        forbid_invalid_cache_salt(raw["cache_salt"])


def forbid_prompt_logprob_token_ids_in_streams(req: GenerateRequest, provided: dict[str, Any]) -> None:
    # The stream chunk has no field for the scores (vLLM's message).
    if req.stream and provided.get("prompt_logprob_token_ids") is not None:
        raise Rejected(
            "prompt_logprob_token_ids are not available when stream=true.",
            param="sampling_params.prompt_logprob_token_ids",
            reason="prompt_logprob_token_ids_in_stream",
        )


def forbid_unreadable_request_id(request_id: str) -> None:
    """The id is echoed in the X-Request-Id header: bounded, printable ASCII."""
    if len(request_id) > MAX_REQUEST_ID_CHARS or not all(" " <= ch <= "~" for ch in request_id):
        raise Rejected(
            f"request_id (or X-Request-Id) must be at most {MAX_REQUEST_ID_CHARS} printable ASCII characters",
            param="request_id",
            reason="invalid_request_id",
        )


def forbid_fingerprint_drift(sent: str | None, ours: str) -> None:
    """The render tier's parser fingerprint (its header), when it sends one, is this server's."""
    if sent is not None and sent != ours:
        raise Rejected(
            f"parser configuration drift: the request was rendered for fingerprint {sent!r}, "
            f"this server's is {ours!r} (tokenizer, chat template, parsers or model differ)",
            status=409,
            param=FINGERPRINT_HEADER,
            reason="fingerprint_mismatch",
        )


def forbid_deep_json(body: bytes) -> None:
    """Nesting beyond MAX_JSON_DEPTH is refused before decoding (a deep `extra_args` would otherwise
    exhaust the recursion limit somewhere downstream)."""
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return  # cannot be that deep: the common case costs two C-level scans
    depth = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise Rejected(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", reason="json_too_deep")
        elif byte in (0x5D, 0x7D):
            depth -= 1


def forbid_params_the_engine_cannot_carry(sp: SamplingParams) -> None:
    """The engine gets the request over msgpack; ints beyond 64 bits would fail there, as a 500.
    `sp.extra_args` carries the transfer params by now."""
    try:
        msgspec.msgpack.encode(sp)
    except (OverflowError, TypeError, ValueError) as e:
        raise Rejected(f"sampling_params or transfer params cannot be sent to the engine: {e}", reason="unencodable") from e
