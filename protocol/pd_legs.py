"""The two legs of a P/D generate request, as pure transformations (no I/O): what llm-d's NIXL v2
routing sidecar sends to the prefill pool and to the decode pool. `protocol.clients.pd` runs them over
httpx (see its docstring for the legs in full)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import msgspec

from protocol.generate import FINGERPRINT_HEADER, REQUEST_ID_HEADER, GenerateRequest, new_request_id

__all__ = ["FINGERPRINT_HEADER", "REQUEST_ID_HEADER", "as_dict", "decode_request", "leg_requests", "prefill_request", "request_id_of"]

# What llm-d's routing sidecar (connector nixlv2) puts on the prefill leg.
PREFILL_KV_TRANSFER_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def as_dict(request: GenerateRequest | Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of the request as plain JSON values (UNSET fields left out)."""
    if isinstance(request, GenerateRequest):
        return msgspec.to_builtins(request)
    return copy.deepcopy(dict(request))


def prefill_request(request: GenerateRequest | Mapping[str, Any]) -> dict[str, Any]:
    """The prefill leg's body for `request` (see the module docstring)."""
    body = as_dict(request)
    body["stream"] = False
    body.pop("stream_options", None)
    body["output_mode"] = "tokens"
    body.pop("chat_request", None)
    body.pop("parse_context", None)
    sampling = dict(body.get("sampling_params") or {})
    sampling["max_tokens"] = 1
    sampling["min_tokens"] = 1
    # Both need a tokenizer, which a --tokens-only prefill pool lacks (it drops them from a prefill
    # leg itself), and neither can matter: the prefill leg's one token is thrown away (the decode
    # engine samples the first token itself). Dropping them here also serves other prefill servers.
    sampling.pop("stop", None)
    sampling.pop("structured_outputs", None)
    body["sampling_params"] = sampling
    body["kv_transfer_params"] = dict(PREFILL_KV_TRANSFER_PARAMS)
    return body


def decode_request(
    request: GenerateRequest | Mapping[str, Any], kv_transfer_params: dict[str, Any] | None, *, stream: bool | None = None
) -> dict[str, Any]:
    """The decode leg's body: the caller's request with the prefill leg's `kv_transfer_params`.

    `stream` overrides the request's own flag (the typed clients force it); None keeps it.
    """
    body = as_dict(request)
    if stream is not None:
        body["stream"] = stream
    body["kv_transfer_params"] = kv_transfer_params
    return body


def leg_requests(
    request: GenerateRequest | Mapping[str, Any], kv_transfer_params: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(prefill leg, decode leg) bodies; the decode leg given the prefill answer's params."""
    return prefill_request(request), decode_request(request, kv_transfer_params)


def request_id_of(request: GenerateRequest | Mapping[str, Any], headers: Mapping[str, str] | None = None) -> str:
    """The id both legs use: as vLLM names a request, the caller's X-Request-Id, else the body's
    `request_id`, else a new one."""
    if headers:
        for k, v in headers.items():
            if k.lower() == REQUEST_ID_HEADER and v:
                return v
    rid = request.request_id if isinstance(request, GenerateRequest) else request.get("request_id")
    if isinstance(rid, str) and rid:
        return rid
    return new_request_id()
