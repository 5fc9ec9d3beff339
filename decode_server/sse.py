"""SSE framing through sse-starlette: `data: {json}\\n\\n` per chunk, an error event, then `[DONE]`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from sse_starlette.sse import EventSourceResponse

from protocol.errors import error_body

log = logging.getLogger("decode_server.sse")

_encoder = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"


def frame(obj: Any) -> bytes:
    return b"data: " + _encoder.encode(obj) + b"\n\n"


async def _framed(
    first: Any, rest: AsyncIterator[Any], describe_error: Callable[[BaseException], tuple[int, str]]
) -> AsyncIterator[bytes]:
    try:
        if first is not None:
            yield frame(first)
        async for chunk in rest:
            yield frame(chunk)
    except Exception as e:  # an error after the 200 went out can only travel as an event
        status, message = describe_error(e)
        log.warning("stream ended with an error event (%d): %s", status, message)
        yield frame(error_body(status, message))
    yield DONE


def sse_response(
    first: Any,
    rest: AsyncIterator[Any],
    describe_error: Callable[[BaseException], tuple[int, str]],
    headers: dict[str, str] | None = None,
) -> EventSourceResponse:
    # sep="\n" keeps vLLM's exact framing (sse-starlette defaults to CRLF).
    return EventSourceResponse(_framed(first, rest, describe_error), sep="\n", headers=headers, ping=15)
