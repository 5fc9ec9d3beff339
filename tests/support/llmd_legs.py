"""The generate legs llm-d-router v0.10.0 sends, rebuilt field for field from its source.

Two routers build P/D legs for `POST /inference/v1/generate` (github.com/llm-d/llm-d-router,
tag v0.10.0; unchanged but for log lines at ebab687):

- the **routing sidecar**, NIXL v2 connector, READ mode (`pkg/sidecar/proxy/connector_nixlv2.go`,
  `handleNIXLV2`): it edits the caller's JSON map in place for the prefill leg, then undoes its
  edits for the decode leg. Everything it does not name (`output_mode`, `stop`,
  `structured_outputs`, `parse_context`, `chat_request`, `cache_salt`, `extra_args`, ...) reaches
  both legs as the caller sent it. Both legs carry the caller's headers plus `x-request-id: <a
  fresh UUID v1>` (`Header.Add`, lines 99 and 305: after a caller's own X-Request-Id).
- the **coordinator** (`pkg/coordinator/steps/prefill.go` and `decode.go`, FormatGenerate): a
  fresh prefill body, and the caller's body with the KV params inside
  `sampling_params.extra_args` (never at the top level) as the decode leg. Both legs carry the
  caller's headers (`ForwardedHeaders`: first values, lower-cased) and `x-request-id` = the
  caller's X-Request-Id when it matches `^[a-zA-Z0-9-]{1,128}$`, else a new UUID
  (`server/handlers.go` 70-76).

Bodies go out as Go's `json.Marshal` writes a `map[string]any`: `go_json()`.
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

# connector_nixlv2.go 162-169 (READ mode) and connectors/kv/nixl.go 37-47: the same object.
PREFILL_KV = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def go_json(body: Any) -> bytes:
    """As Go's json.Marshal: map keys sorted, no spaces, UTF-8 kept, `<`, `>`, `&`, U+2028/9 escaped."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text.encode()


def sidecar_request_id() -> str:
    return str(uuid.uuid1())  # uuid.NewUUID(): a version-1 UUID


def sidecar_prefill_leg(caller: dict[str, Any]) -> dict[str, Any]:
    """connector_nixlv2.go 97-182: kv_transfer_params replaced (162-169), `stream: false` and no
    `stream_options` (175-176), `sampling_params.max_tokens` and `.min_tokens` set to 1 (178-180;
    `generateStyleTokenLimitFields`, proxy.go 145; `tokenLimitMap`, 42-53, creates
    sampling_params when absent). Nothing else changes."""
    body = copy.deepcopy(caller)
    body["kv_transfer_params"] = dict(PREFILL_KV)
    body["stream"] = False
    body.pop("stream_options", None)
    sampling = body.get("sampling_params")
    if not isinstance(sampling, dict):
        sampling = body["sampling_params"] = {}
    sampling["max_tokens"] = 1
    sampling["min_tokens"] = 1
    return body


def sidecar_decode_leg(caller: dict[str, Any], prefill_answer: dict[str, Any]) -> dict[str, Any]:
    """connector_nixlv2.go 337-407: `stream`, `stream_options`, `max_tokens`, `min_tokens` back as
    the caller sent them (absent ones deleted; a sampling_params it created and left empty
    dropped, 359), and `kv_transfer_params` = the prefill answer's, unmodified (null when absent, 405)."""
    body = copy.deepcopy(caller)
    body["kv_transfer_params"] = prefill_answer.get("kv_transfer_params")
    return body


def coordinator_prefill_leg(caller: dict[str, Any], request_id: str) -> dict[str, Any]:
    """prefill.go 178-195 (`buildPrefillBody`, FormatGenerate): a fresh body, `request_id`,
    `token_ids`, `model` (the caller's, "" when absent: handlers.go 70) and `sampling_params:
    {max_tokens: 1, extra_args: {kv_transfer_params}}` (`setGenerateTransferParams`, utils.go 161),
    then `capSingleTokenOutput` (utils.go 83-109): min_tokens deleted, `stream: false`, no
    stream_options. None of the caller's sampling params or output fields come along."""
    model = caller.get("model")
    return {
        "request_id": request_id,
        "token_ids": list(caller["token_ids"]),
        "model": model if isinstance(model, str) else "",
        "sampling_params": {"max_tokens": 1, "extra_args": {"kv_transfer_params": dict(PREFILL_KV)}},
        "stream": False,
    }


def coordinator_decode_leg(caller: dict[str, Any], prefill_answer: dict[str, Any]) -> dict[str, Any]:
    """decode.go 104-114 (`prepareDecodeBody`, FormatGenerate): the caller's body with
    `sampling_params.extra_args.kv_transfer_params` = the prefill answer's params copied with
    `do_remote_decode: false, do_remote_prefill: true` (kv/nixl.go 50-59), merged into the caller's
    sampling_params and extra_args; nothing at the top level."""
    body = copy.deepcopy(caller)
    kv = dict(prefill_answer.get("kv_transfer_params") or {})
    kv.update(do_remote_decode=False, do_remote_prefill=True)
    sampling = body.get("sampling_params")
    if not isinstance(sampling, dict):
        sampling = body["sampling_params"] = {}
    extra = sampling.get("extra_args")
    if not isinstance(extra, dict):
        extra = sampling["extra_args"] = {}
    extra["kv_transfer_params"] = kv
    return body
