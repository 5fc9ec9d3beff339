"""Typed httpx clients (sync and async) for decode-server and vLLM's generate protocol.

`generate()` returns the typed batch response of the request's output mode,
`stream()` yields typed chunks (SSE parsed by httpx-sse), `abort()` aborts by the caller's
request ids. A non-2xx answer, or an error event inside a stream, raises `GenerateError`
carrying the status, the server's message and param, the response headers and the raw body.

Retries (`Retry`) happen only where the request provably did not start on the server: a
connect error (nothing was sent) or a 503 (the server answers 503 before it admits a request:
draining, engine dead). Once a 2xx status line has arrived nothing is retried; read errors,
timeouts after sending and every other status are raised as they are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import anyio
import httpx
import msgspec
from httpx_sse import EventSource, ServerSentEvent

from protocol.errors import ErrorResponse, GenerateError
from protocol.generate import MODE_TYPES, GenerateRequest, UsageChunk
from protocol.clients.retry import NO_RETRY, NOT_SENT_ERRORS, Retry, parse_retry_after  # noqa: F401 (re-exported)

__all__ = [
    "ABORT_PATH",
    "GENERATE_PATH",
    "AsyncClient",
    "Client",
    "GenerateError",
    "NO_RETRY",
    "Retry",
    "aiter_chunks",
    "chunk_from_event",
    "error_from_response",
    "iter_chunks",
]

GENERATE_PATH = "/inference/v1/generate"
ABORT_PATH = "/inference/v1/abort_requests"

log = logging.getLogger("protocol.clients.generate")

_encoder = msgspec.json.Encoder()
# ---------------------------------------------------------------- bodies and errors


def _body(request: GenerateRequest | Mapping[str, Any], stream: bool) -> bytes:
    data = msgspec.to_builtins(request) if isinstance(request, GenerateRequest) else dict(request)
    data["stream"] = stream
    return _encoder.encode(data)


def _mode(request: GenerateRequest | Mapping[str, Any]) -> str:
    return request.output_mode if isinstance(request, GenerateRequest) else request.get("output_mode", "tokens")


def error_from_response(status: int, content: bytes, headers: Mapping[str, str] | None = None) -> GenerateError:
    """The GenerateError for a non-2xx answer: the message/param of a vLLM-shaped error body,
    else the body's first 500 characters; status, headers and the whole body kept."""
    try:
        err = msgspec.json.decode(content, type=ErrorResponse).error
        return GenerateError(status, err.message, err.param, headers=headers, body=content)
    except msgspec.MsgspecError:
        return GenerateError(status, content[:500].decode(errors="replace"), headers=headers, body=content)


def _raise_for(status: int, content: bytes, headers: Mapping[str, str] | None = None) -> None:
    raise error_from_response(status, content, headers)


def _event_error(data: str, headers: Mapping[str, str] | None) -> GenerateError:
    """The GenerateError of an error event: status is the event's `error.code` (500 if absent)."""
    raw_bytes = data.encode()
    try:
        raw = msgspec.json.decode(raw_bytes)
    except msgspec.DecodeError:
        raw = None
    err = raw.get("error") if isinstance(raw, dict) else None
    if isinstance(err, dict):
        code = err.get("code")
        status = code if isinstance(code, int) else 500
        return GenerateError(status, str(err.get("message", "")), err.get("param"), headers=headers, body=raw_bytes)
    message = err if isinstance(err, str) else data[:500]
    return GenerateError(500, message, headers=headers, body=raw_bytes)


def chunk_from_event(event: ServerSentEvent, mode: str, headers: Mapping[str, str] | None = None) -> Any | None:
    """One SSE event → a typed chunk of `mode`.

    None for `[DONE]`, for events without data and for named events other than `message` and
    `error` (as a browser's EventSource `onmessage` does). An error event (data with an `error`
    key and no `choices`, or `event: error`) raises GenerateError.
    """
    if event.event not in ("message", "error"):
        return None
    data = event.data
    if event.event == "error":
        raise _event_error(data, headers)
    if not data or data == "[DONE]":
        return None
    raw = msgspec.json.decode(data)
    if isinstance(raw, dict) and "error" in raw and "choices" not in raw:
        raise _event_error(data, headers)
    if isinstance(raw, dict) and not raw.get("choices") and raw.get("usage"):
        return msgspec.convert(raw, UsageChunk)
    return msgspec.convert(raw, MODE_TYPES[mode].chunk)


def _is_sse(r: httpx.Response) -> bool:
    return "text/event-stream" in r.headers.get("content-type", "").partition(";")[0]


def _not_sse(r: httpx.Response, body: bytes) -> GenerateError:
    content_type = r.headers.get("content-type", "")
    message = f"expected a text/event-stream answer, got content-type {content_type!r}"
    return GenerateError(r.status_code, message, headers=r.headers, body=body)


def iter_chunks(r: httpx.Response, mode: str) -> Iterator[Any]:
    """Typed chunks of an open 200 SSE response (sync); raises GenerateError for an error event."""
    if not _is_sse(r):
        raise _not_sse(r, r.read())
    for event in EventSource(r).iter_sse():
        chunk = chunk_from_event(event, mode, r.headers)
        if chunk is not None:
            yield chunk


async def aiter_chunks(r: httpx.Response, mode: str) -> AsyncIterator[Any]:
    """Typed chunks of an open 200 SSE response (async); raises GenerateError for an error event."""
    if not _is_sse(r):
        raise _not_sse(r, await r.aread())
    async for event in EventSource(r).aiter_sse():
        chunk = chunk_from_event(event, mode, r.headers)
        if chunk is not None:
            yield chunk


# ---------------------------------------------------------------- clients


def _default_headers(api_key: str | None, headers: Mapping[str, str] | None) -> httpx.Headers:
    out = httpx.Headers({"Authorization": f"Bearer {api_key}"} if api_key else {})
    out.update(headers or {})
    return out


def _call_headers(headers: Mapping[str, str] | None, *, sse: bool) -> httpx.Headers:
    out = httpx.Headers({"content-type": "application/json"})
    if sse:
        out["accept"] = "text/event-stream"
    out.update(headers or {})
    return out


def _log_retry(path: str, attempt: int, why: str, wait: float) -> None:
    log.info("POST %s: try %d got %s; retrying in %.3fs", path, attempt, why, wait)


class Client:
    """Sync client. `headers` go on every call (per-call `headers=` add to / override them);
    `retry` is the retry policy (None: never retry); other keyword arguments go to
    `httpx.Client` unchanged (transport, verify, cert, limits, proxy, event_hooks, ...)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | httpx.Timeout | None = 600.0,
        retry: Retry | None = Retry(),
        **httpx_kwargs: Any,
    ):
        self.retry = retry or NO_RETRY
        self.http = httpx.Client(
            base_url=base_url, headers=_default_headers(api_key, headers), timeout=timeout, **httpx_kwargs
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _send(self, path: str, content: bytes, headers: Mapping[str, str] | None, *, sse: bool = False) -> httpx.Response:
        """POST with the retry policy; returns the open 2xx response (the caller closes it)."""
        call_headers = _call_headers(headers, sse=sse)
        attempt = 1
        while True:
            request = self.http.build_request("POST", path, content=content, headers=call_headers)
            try:
                r = self.http.send(request, stream=True)
            except httpx.TransportError as e:
                wait = self.retry.wait_after_error(attempt, e)
                if wait is None:
                    raise
                _log_retry(path, attempt, type(e).__name__, wait)
            else:
                if r.is_success:
                    return r
                try:
                    body = r.read()
                finally:
                    r.close()
                wait = self.retry.wait_after_status(attempt, r.status_code, r.headers)
                if wait is None:
                    raise error_from_response(r.status_code, body, r.headers)
                _log_retry(path, attempt, str(r.status_code), wait)
            time.sleep(wait)
            attempt += 1

    def generate(self, request: GenerateRequest | Mapping[str, Any], *, headers: Mapping[str, str] | None = None) -> Any:
        r = self._send(GENERATE_PATH, _body(request, False), headers)
        try:
            content = r.read()
        finally:
            r.close()
        return msgspec.json.decode(content, type=MODE_TYPES[_mode(request)].response)

    def stream(self, request: GenerateRequest | Mapping[str, Any], *, headers: Mapping[str, str] | None = None) -> Iterator[Any]:
        mode = _mode(request)
        r = self._send(GENERATE_PATH, _body(request, True), headers, sse=True)
        try:
            yield from iter_chunks(r, mode)
        finally:
            r.close()

    def abort(self, request_ids: list[str], *, headers: Mapping[str, str] | None = None) -> None:
        self._send(ABORT_PATH, _encoder.encode({"request_ids": request_ids}), headers).close()


class AsyncClient:
    """Async client; the same arguments as `Client` (httpx options go to `httpx.AsyncClient`)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | httpx.Timeout | None = 600.0,
        retry: Retry | None = Retry(),
        **httpx_kwargs: Any,
    ):
        self.retry = retry or NO_RETRY
        self.http = httpx.AsyncClient(
            base_url=base_url, headers=_default_headers(api_key, headers), timeout=timeout, **httpx_kwargs
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _send(
        self, path: str, content: bytes, headers: Mapping[str, str] | None, *, sse: bool = False
    ) -> httpx.Response:
        call_headers = _call_headers(headers, sse=sse)
        attempt = 1
        while True:
            request = self.http.build_request("POST", path, content=content, headers=call_headers)
            try:
                r = await self.http.send(request, stream=True)
            except httpx.TransportError as e:
                wait = self.retry.wait_after_error(attempt, e)
                if wait is None:
                    raise
                _log_retry(path, attempt, type(e).__name__, wait)
            else:
                if r.is_success:
                    return r
                try:
                    body = await r.aread()
                finally:
                    await r.aclose()
                wait = self.retry.wait_after_status(attempt, r.status_code, r.headers)
                if wait is None:
                    raise error_from_response(r.status_code, body, r.headers)
                _log_retry(path, attempt, str(r.status_code), wait)
            await anyio.sleep(wait)
            attempt += 1

    async def generate(
        self, request: GenerateRequest | Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> Any:
        r = await self._send(GENERATE_PATH, _body(request, False), headers)
        try:
            content = await r.aread()
        finally:
            await r.aclose()
        return msgspec.json.decode(content, type=MODE_TYPES[_mode(request)].response)

    async def stream(
        self, request: GenerateRequest | Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[Any]:
        mode = _mode(request)
        r = await self._send(GENERATE_PATH, _body(request, True), headers, sse=True)
        try:
            async for chunk in aiter_chunks(r, mode):
                yield chunk
        finally:
            await r.aclose()

    async def abort(self, request_ids: list[str], *, headers: Mapping[str, str] | None = None) -> None:
        await (await self._send(ABORT_PATH, _encoder.encode({"request_ids": request_ids}), headers)).aclose()
