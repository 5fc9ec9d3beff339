"""Every fail-loud rule for a generate request, one function each, named after what it forbids.

Each raises `errors.Rejected` with the status and a message that names the cause. The
order matters only in that cheap structural rules run before vLLM's own
SamplingParams validation, whose message is surfaced unchanged.
"""

from __future__ import annotations

from typing import Any

import msgspec
from vllm.entrypoints.generate.base.protocol import validate_cache_salt
from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind, SamplingParams

from decode_server.config import MAX_JSON_DEPTH, MAX_REQUEST_ID_CHARS
from decode_server.runtime.engine import EngineLimits
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


def vllm_sampling_params(provided: dict[str, Any]) -> SamplingParams:
    """vLLM's own SamplingParams from the caller's keys; its validation message is surfaced as is."""
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


def forbid_params_the_engine_cannot_carry(sp: SamplingParams, req: GenerateRequest) -> None:
    """The engine gets the request over msgpack; ints beyond 64 bits would fail there, as a 500."""
    try:
        msgspec.msgpack.encode((sp, req.kv_transfer_params, req.ec_transfer_params))
    except (OverflowError, TypeError, ValueError) as e:
        raise Rejected(f"sampling_params or transfer params cannot be sent to the engine: {e}", reason="unencodable") from e


# ------------------------------------------------------------------ P/D prefill legs


def kv_transfer_params_of(req: GenerateRequest) -> dict[str, Any] | None:
    """The KV-transfer params the engine gets: the top-level field (vLLM's generate, llm-d's routing
    sidecar), else `sampling_params.extra_args.kv_transfer_params` (llm-d's coordinator). The top
    level wins, as in `build_sampling_params` and vLLM's generate."""
    if req.kv_transfer_params is not None:
        return req.kv_transfer_params
    extra = req.sampling_params.extra_args
    params = extra.get("kv_transfer_params") if isinstance(extra, dict) else None
    return params if isinstance(params, dict) else None


def is_prefill_leg(req: GenerateRequest) -> bool:
    """A P/D router's prefill leg: its KV stays for a remote decoder (`do_remote_decode: true`) and
    it asks for one token, which every router throws away (llm-d's sidecar and coordinator, and
    `protocol.clients.pd`, keep only the answer's `kv_transfer_params`): its answer never reaches a client."""
    kv = kv_transfer_params_of(req)
    return kv is not None and kv.get("do_remote_decode") is True and req.sampling_params.max_tokens == 1


def as_tokens_prefill_leg(req: GenerateRequest) -> GenerateRequest:
    """The prefill leg without what only its decode leg reads and a server without a tokenizer
    cannot serve (llm-d's sidecar forwards all of it): the text levels and their chat context,
    stop strings, structured outputs. Its one token is discarded, so none of them can matter."""
    sampling = msgspec.structs.replace(req.sampling_params, stop=msgspec.UNSET, structured_outputs=msgspec.UNSET)
    return msgspec.structs.replace(
        req, output_mode="tokens", parse_context=None, chat_request=None, sampling_params=sampling
    )


def _text_is_unobservable(req: GenerateRequest, sp: SamplingParams) -> bool:
    """At the tokens level nothing on the wire needs the engine's incremental detokenizer unless
    stop strings are matched or prompt logprobs carry decoded tokens: skip that per-token work."""
    return req.output_mode == "tokens" and not sp.stop and sp.prompt_logprobs is None


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
    forbid_prompt_logprob_token_ids_in_streams(req, provided)
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
    forbid_prompt_without_room_for_output(prompt_len, limits)
    forbid_params_the_engine_cannot_carry(sp, req)
    if tokens_only or _text_is_unobservable(req, sp):
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
