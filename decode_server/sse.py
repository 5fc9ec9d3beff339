"""SSE framing through sse-starlette: `data: {json}\\n\\n` per chunk, an error event, then `[DONE]`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from sse_starlette.sse import EventSourceResponse, SendTimeoutError, ServerSentEvent

from decode_server.config import STREAM_SEND_TIMEOUT_S
from decode_server.errors import describe
from protocol.errors import error_body

log = logging.getLogger("decode_server.sse")

_encoder = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"


def frame(obj: Any) -> bytes:
    return b"data: " + _encoder.encode(obj) + b"\n\n"


async def _framed(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    try:
        if first is not None:
            yield frame(first)
        async for chunk in rest:
            yield frame(chunk)
    except Exception as e:  # an error after the 200 went out can only travel as an event
        error = describe(e)
        log.warning("stream ended with an error event (%d): %s", error.status, error.message)
        yield frame(error_body(error.status, error.message, error.param, error.error_type))
    yield DONE


def sse_response(
    first: Any, rest: AsyncIterator[Any], headers: dict[str, str] | None = None, keep_alive_s: float = 0
) -> EventSourceResponse:
    # sep="\n" keeps vLLM's exact framing (sse-starlette defaults to CRLF); ping=0 sends no
    # comment lines unless the operator asks for keep-alives (vLLM: --sse-keep-alive-interval,
    # whose comment is `: keep-alive`).
    return _Stream(
        _framed(first, rest), sep="\n", headers=headers, ping=keep_alive_s, ping_message_factory=_keep_alive,
        send_timeout=STREAM_SEND_TIMEOUT_S or None,
    )


class _Stream(EventSourceResponse):
    """A client that reads nothing for STREAM_SEND_TIMEOUT_S (every buffer full) is cut: the chunks
    are closed (the engine request is aborted, the access line says 499), uvicorn drops the socket."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            log.warning("stream cut: its client read nothing for %.0f s", STREAM_SEND_TIMEOUT_S)


def _keep_alive() -> ServerSentEvent:
    return ServerSentEvent(comment="keep-alive", sep="\n")
