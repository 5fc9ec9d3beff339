"""Prefill/decode orchestration for `POST /inference/v1/generate`, as llm-d's NIXL v2 sidecar does it.

One generate request becomes two legs:

1. the **prefill leg**, to a prefill server (`--tokens-only`, `kv_role: kv_producer`): the
   caller's request with `stream: false`, no `stream_options`, `max_tokens: 1`,
   `min_tokens: 1`, `output_mode: "tokens"`, no `chat_request` / `parse_context`, no
   `sampling_params.stop` or `.structured_outputs` (llm-d's sidecar keeps all of these; a
   `--tokens-only` decode-server drops them itself on a prefill leg), and
   `kv_transfer_params` = `PREFILL_KV_TRANSFER_PARAMS`
   (`do_remote_decode: true`). Its batch answer carries the producer's `kv_transfer_params`
   (engine id, block ids, side-channel host and port).
2. the **decode leg**, to a decode server (`kv_role: kv_consumer`): the caller's request as
   sent (its `output_mode`, `stream`, `stream_options`, `parse_context`, `max_tokens`, stop
   strings, ...) with `kv_transfer_params` replaced by what the prefill leg returned. The
   decode engine pulls the prompt's KV blocks over NIXL and generates from there.

Both legs carry the same `X-Request-Id` (the caller's X-Request-Id, else its `request_id`, else a new one). The
`x-parser-fingerprint` header, if the caller sends one, goes to the decode leg only (the
prefill pool has no tokenizer, so its fingerprint differs by design).

`leg_requests()` / `prefill_request()` / `decode_request()` are the pure transformations (`protocol.pd_legs`, re-exported here);
`PDClient` (sync) and `AsyncPDClient` run them over httpx. This module imports no vLLM.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx
import msgspec

from protocol.clients.generate import GENERATE_PATH, _mode, _raise_for, aiter_chunks, error_from_response, iter_chunks
from protocol.errors import GenerateError
from protocol.generate import MODE_TYPES, GenerateRequest
from protocol.pd_legs import (  # noqa: F401  (re-exported: the legs are part of this module's API)
    FINGERPRINT_HEADER,
    PREFILL_KV_TRANSFER_PARAMS,
    REQUEST_ID_HEADER,
    as_dict,
    decode_request,
    leg_requests,
    prefill_request,
    request_id_of,
)

log = logging.getLogger("protocol.clients.pd")


_encoder = msgspec.json.Encoder()


class PrefillLegError(GenerateError):
    """The prefill leg failed: its status and the prefill server's message."""


def _leg_headers(
    base: Mapping[str, str] | None, request_id: str, *, leg: str
) -> dict[str, str]:
    headers = {"content-type": "application/json", REQUEST_ID_HEADER: request_id}
    for k, v in (base or {}).items():
        lk = k.lower()
        if lk in ("content-type", "content-length", REQUEST_ID_HEADER, "host"):
            continue
        if lk == FINGERPRINT_HEADER and leg != "decode":
            continue
        headers[lk] = v
    return headers


def _kv_params_from(status: int, content: bytes, headers: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    if status != 200:
        e = error_from_response(status, content, headers)
        raise PrefillLegError(e.status, f"prefill leg failed: {e.message}", e.param, headers=e.headers, body=e.body)
    try:
        answer = msgspec.json.decode(content)
    except msgspec.DecodeError as e:
        raise PrefillLegError(
            502, f"prefill leg answered with invalid JSON: {e}", headers=headers, body=content
        ) from None
    params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
    if params is None:
        # As llm-d's sidecar: warn and let the decode server prefill locally.
        log.warning("the prefill leg's answer has no kv_transfer_params; the decode leg will prefill itself")
    return params


def _auth(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


class PDClient:
    """Sync P/D client: `generate()` → typed batch response, `stream()` → typed chunks,
    `stream_lines()` → the decode leg's raw SSE lines."""

    def __init__(
        self,
        prefill_url: str,
        decode_url: str,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = 600.0,
        headers: Mapping[str, str] | None = None,
        **httpx_kwargs: Any,
    ):
        self._prefill = httpx.Client(base_url=prefill_url, timeout=timeout, **httpx_kwargs)
        self._decode = httpx.Client(base_url=decode_url, timeout=timeout, **httpx_kwargs)
        self._headers = {**_auth(api_key), **(headers or {})}
        self.last_kv_transfer_params: dict[str, Any] | None = None

    def close(self) -> None:
        self._prefill.close()
        self._decode.close()

    def __enter__(self) -> PDClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def prefill(
        self,
        request: GenerateRequest | Mapping[str, Any],
        request_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """Run the prefill leg; return the `kv_transfer_params` for the decode leg."""
        rid = request_id or request_id_of(request, headers)
        r = self._prefill.post(
            GENERATE_PATH,
            content=_encoder.encode(prefill_request(request)),
            headers=_leg_headers({**self._headers, **(headers or {})}, rid, leg="prefill"),
        )
        params = _kv_params_from(r.status_code, r.content, r.headers)
        self.last_kv_transfer_params = params
        return params

    def _open(
        self, request: GenerateRequest | Mapping[str, Any], stream: bool, headers: Mapping[str, str] | None
    ) -> httpx.Response:
        """Both legs; returns the open decode response (the caller closes it), raising for non-200."""
        rid = request_id_of(request, headers)
        params = self.prefill(request, rid, headers)
        body = decode_request(request, params, stream=stream)
        req = self._decode.build_request(
            "POST",
            GENERATE_PATH,
            content=_encoder.encode(body),
            headers=_leg_headers({**self._headers, **(headers or {})}, rid, leg="decode"),
        )
        r = self._decode.send(req, stream=True)
        if r.status_code != 200:
            try:
                content = r.read()
            finally:
                r.close()
            _raise_for(r.status_code, content, r.headers)
        return r

    def generate(self, request: GenerateRequest | Mapping[str, Any], *, headers: Mapping[str, str] | None = None) -> Any:
        r = self._open(request, False, headers)
        try:
            content = r.read()
        finally:
            r.close()
        return msgspec.json.decode(content, type=MODE_TYPES[_mode(request)].response)

    def stream_lines(
        self, request: GenerateRequest | Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> Iterator[str]:
        r = self._open(request, True, headers)
        try:
            yield from r.iter_lines()
        finally:
            r.close()

    def stream(self, request: GenerateRequest | Mapping[str, Any], *, headers: Mapping[str, str] | None = None) -> Iterator[Any]:
        r = self._open(request, True, headers)
        try:
            yield from iter_chunks(r, _mode(request))
        finally:
            r.close()


class AsyncPDClient:
    """Async P/D client; `send_decode()` gives the raw streaming decode response (for proxies)."""

    def __init__(
        self,
        prefill_url: str,
        decode_url: str,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = 600.0,
        headers: Mapping[str, str] | None = None,
        **httpx_kwargs: Any,
    ):
        self._prefill = httpx.AsyncClient(base_url=prefill_url, timeout=timeout, **httpx_kwargs)
        self._decode = httpx.AsyncClient(base_url=decode_url, timeout=timeout, **httpx_kwargs)
        self._headers = {**_auth(api_key), **(headers or {})}
        self.last_kv_transfer_params: dict[str, Any] | None = None

    async def aclose(self) -> None:
        await self._prefill.aclose()
        await self._decode.aclose()

    async def __aenter__(self) -> AsyncPDClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def prefill(
        self,
        request: GenerateRequest | Mapping[str, Any],
        request_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any] | None:
        rid = request_id or request_id_of(request, headers)
        r = await self._prefill.post(
            GENERATE_PATH,
            content=_encoder.encode(prefill_request(request)),
            headers=_leg_headers({**self._headers, **(headers or {})}, rid, leg="prefill"),
        )
        params = _kv_params_from(r.status_code, r.content, r.headers)
        self.last_kv_transfer_params = params
        return params

    async def send_decode(
        self,
        request: GenerateRequest | Mapping[str, Any],
        kv_transfer_params: dict[str, Any] | None,
        request_id: str,
        *,
        stream: bool | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send the decode leg and return the open response (the caller must `aclose()` it)."""
        body = decode_request(request, kv_transfer_params, stream=stream)
        req = self._decode.build_request(
            "POST",
            GENERATE_PATH,
            content=_encoder.encode(body),
            headers=_leg_headers({**self._headers, **(headers or {})}, request_id, leg="decode"),
        )
        return await self._decode.send(req, stream=True)

    async def _open(
        self, request: GenerateRequest | Mapping[str, Any], stream: bool, headers: Mapping[str, str] | None
    ) -> httpx.Response:
        """Both legs; returns the open decode response (the caller closes it), raising for non-200."""
        rid = request_id_of(request, headers)
        params = await self.prefill(request, rid, headers)
        r = await self.send_decode(request, params, rid, stream=stream, headers=headers)
        if r.status_code != 200:
            try:
                content = await r.aread()
            finally:
                await r.aclose()
            _raise_for(r.status_code, content, r.headers)
        return r

    async def generate(
        self, request: GenerateRequest | Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> Any:
        r = await self._open(request, False, headers)
        try:
            content = await r.aread()
        finally:
            await r.aclose()
        return msgspec.json.decode(content, type=MODE_TYPES[_mode(request)].response)

    async def stream_lines(
        self, request: GenerateRequest | Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[str]:
        r = await self._open(request, True, headers)
        try:
            async for line in r.aiter_lines():
                yield line
        finally:
            await r.aclose()

    async def stream(
        self, request: GenerateRequest | Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[Any]:
        r = await self._open(request, True, headers)
        try:
            async for chunk in aiter_chunks(r, _mode(request)):
                yield chunk
        finally:
            await r.aclose()
