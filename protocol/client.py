"""Typed httpx clients (sync and async) for decode-server and vLLM's generate protocol.

`generate()` returns the typed batch response of the request's output mode,
`stream()` yields typed chunks, `abort()` aborts by the caller's request ids.
A non-2xx answer, or an error event inside a stream, raises `GenerateError`
carrying the server's message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import msgspec

from protocol.errors import ErrorResponse, GenerateError
from protocol.generate import MODE_TYPES, GenerateRequest, UsageChunk

GENERATE_PATH = "/inference/v1/generate"
ABORT_PATH = "/inference/v1/abort_requests"

_encoder = msgspec.json.Encoder()


def _body(request: GenerateRequest | dict[str, Any], stream: bool) -> bytes:
    data = msgspec.to_builtins(request) if isinstance(request, GenerateRequest) else dict(request)
    data["stream"] = stream
    return _encoder.encode(data)


def _mode(request: GenerateRequest | dict[str, Any]) -> str:
    return request.output_mode if isinstance(request, GenerateRequest) else request.get("output_mode", "tokens")


def _raise_for(status: int, content: bytes) -> None:
    try:
        err = msgspec.json.decode(content, type=ErrorResponse).error
        raise GenerateError(status, err.message, err.param)
    except msgspec.MsgspecError:
        raise GenerateError(status, content[:500].decode(errors="replace")) from None


def parse_sse_data(line: str, mode: str) -> Any | None:
    """One `data:` line → a typed chunk; None for [DONE] and non-data lines."""
    if not line.startswith("data: "):
        return None
    payload = line[6:]
    if payload == "[DONE]":
        return None
    raw = msgspec.json.decode(payload)
    if "error" in raw and "choices" not in raw:
        err = raw["error"]
        raise GenerateError(err.get("code", 500), err.get("message", ""), err.get("param"))
    if not raw.get("choices") and "usage" in raw and raw.get("usage"):
        return msgspec.convert(raw, UsageChunk)
    return msgspec.convert(raw, MODE_TYPES[mode].chunk)


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class Client:
    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float | None = 600.0):
        self._http = httpx.Client(base_url=base_url, headers=_headers(api_key), timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def generate(self, request: GenerateRequest | dict[str, Any]) -> Any:
        r = self._http.post(GENERATE_PATH, content=_body(request, False), headers={"content-type": "application/json"})
        if r.status_code != 200:
            _raise_for(r.status_code, r.content)
        return msgspec.json.decode(r.content, type=MODE_TYPES[_mode(request)].response)

    def stream(self, request: GenerateRequest | dict[str, Any]) -> Iterator[Any]:
        mode = _mode(request)
        with self._http.stream(
            "POST", GENERATE_PATH, content=_body(request, True), headers={"content-type": "application/json"}
        ) as r:
            if r.status_code != 200:
                r.read()
                _raise_for(r.status_code, r.content)
            for line in r.iter_lines():
                chunk = parse_sse_data(line, mode)
                if chunk is not None:
                    yield chunk

    def abort(self, request_ids: list[str]) -> None:
        r = self._http.post(ABORT_PATH, json={"request_ids": request_ids})
        if r.status_code != 200:
            _raise_for(r.status_code, r.content)


class AsyncClient:
    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float | None = 600.0, **httpx_kwargs: Any):
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(api_key), timeout=timeout, **httpx_kwargs)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def generate(self, request: GenerateRequest | dict[str, Any]) -> Any:
        r = await self._http.post(
            GENERATE_PATH, content=_body(request, False), headers={"content-type": "application/json"}
        )
        if r.status_code != 200:
            _raise_for(r.status_code, r.content)
        return msgspec.json.decode(r.content, type=MODE_TYPES[_mode(request)].response)

    async def stream(self, request: GenerateRequest | dict[str, Any]) -> AsyncIterator[Any]:
        mode = _mode(request)
        async with self._http.stream(
            "POST", GENERATE_PATH, content=_body(request, True), headers={"content-type": "application/json"}
        ) as r:
            if r.status_code != 200:
                await r.aread()
                _raise_for(r.status_code, r.content)
            async for line in r.aiter_lines():
                chunk = parse_sse_data(line, mode)
                if chunk is not None:
                    yield chunk

    async def abort(self, request_ids: list[str]) -> None:
        r = await self._http.post(ABORT_PATH, json={"request_ids": request_ids})
        if r.status_code != 200:
            _raise_for(r.status_code, r.content)
