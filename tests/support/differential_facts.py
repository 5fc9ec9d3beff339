"""What a corpus request is, as facts the allowed lists (tests/support/allowed.py) match on: which
sampling fields it sets (vLLM's SamplingParams' own field list), which values only lax decoding
accepts, which top-level options it uses."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from tests.support.differential import MISSING
from tests.support.differential_corpus import MAX_MODEL_LEN, VOCAB_SIZE, Case


def _sp_fields() -> dict[str, Any]:
    from vllm.sampling_params import SamplingParams

    return {f.name: f.type for f in msgspec.structs.fields(SamplingParams) if not f.name.startswith("_")}


SP_FIELDS = _sp_fields()
_REPETITION_FIELDS = {"max_pattern_size", "min_pattern_size", "min_count"}
_BOOL_STRINGS = {"true", "false", "1", "0", "yes", "no", "on", "off", "t", "f", "y", "n"}
_TOP_TYPES = {"stream": bool, "return_token_ids": bool, "reasoning_ended": bool, "priority": int}


def _base(tp: Any) -> Any:
    import types as _types
    import typing

    if typing.get_origin(tp) in (typing.Union, _types.UnionType):
        args = [t for t in typing.get_args(tp) if t is not type(None)]
        return args[0] if len(args) == 1 else None
    return tp


def _lax_coercible(value: Any, tp: Any) -> bool:
    """A JSON value of the wrong type that pydantic/msgspec lax mode turns into `tp`."""
    tp = _base(tp)
    if tp is int:
        return (isinstance(value, float) and value.is_integer()) or (
            isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value) is not None) or isinstance(value, bool)
    if tp is float:
        return isinstance(value, str) and re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*", value) is not None
    if tp is bool:
        return (isinstance(value, str) and value.lower() in _BOOL_STRINGS) or (
            not isinstance(value, bool) and isinstance(value, (int, float)) and value in (0, 1))
    return False


def facts(case: Case) -> frozenset[str]:
    """What a request is, as the allow-list and pending list read it (the same for hand-written
    and generated cases)."""
    f: set[str] = set()
    media = (case.content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        f.add("content-type-not-json")
    if case.raw is not None or not isinstance(case.body, dict):
        f.add("body-not-an-object")
        return frozenset(f)
    b = case.body
    if any(k.lower() == "x-request-id" for k in case.headers):
        f.add("header-request-id")
    if isinstance(b.get("request_id"), str):
        f.add("body-request-id")
    if b.get("output_mode") == "derender":
        f.add("derender")
    if b.get("chat_request") is not None:
        f.add("chat-request")
    if b.get("features") or b.get("content_parts"):
        f.add("multimodal")
    if b.get("model") == "":
        f.add("model-empty")
    salt = b.get("cache_salt")
    if isinstance(salt, str) and salt and (len(salt) > 128 or any(ch in salt for ch in "@/\\\x00")):
        f.add("cache-salt-vllm-rule")
    for key, tp in _TOP_TYPES.items():
        if key in b and _lax_coercible(b[key], tp):
            f.add("lax-coercion")
    tokens = b.get("token_ids")
    if isinstance(tokens, list):
        if any(_lax_coercible(t, int) for t in tokens):
            f.add("lax-coercion")
        if any(isinstance(t, int) and not isinstance(t, bool) and t >= VOCAB_SIZE for t in tokens):
            f.add("token-beyond-vocab")
    sp = b.get("sampling_params", MISSING)
    if sp is MISSING:
        f.add("no-sampling-params")
    if isinstance(sp, dict):
        nested = sp.get("repetition_detection")
        if any(k not in SP_FIELDS for k in sp) or (
                isinstance(nested, dict) and any(k not in _REPETITION_FIELDS for k in nested)):
            f.add("unknown-sampling-key")
        for key, value in sp.items():
            if key in SP_FIELDS and _lax_coercible(value, SP_FIELDS[key]):
                f.add("lax-coercion")
        if sp.get("prompt_logprob_token_ids") is not None:
            f.add("prompt-logprob-token-ids")
        max_tokens = sp.get("max_tokens")
        if isinstance(tokens, list) and isinstance(max_tokens, int) and len(tokens) + max_tokens > MAX_MODEL_LEN \
                and len(tokens) < MAX_MODEL_LEN:
            f.add("max-tokens-beyond-context")
    return frozenset(f)
