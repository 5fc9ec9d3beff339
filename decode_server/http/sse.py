"""SSE through sse-starlette: the stream's events (framed bytes, or chunks framed here), an error event, then `[DONE]`.

The per-event path is kept to one ASGI send: sse-starlette's own send timeout opens an anyio cancel
scope (and schedules a timer) around every event, which cost more than the rest of the frame
(`python -m bench.sse_cost`); a stalled reader is caught instead by one watch per stream that looks
at the send in progress a few times per limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from decode_server.errors import describe
from decode_server.generate.pipeline.frames import DONE, frame
from protocol.errors import error_body

log = logging.getLogger("decode_server.http.sse")

__all__ = ["DONE", "frame", "sse_response"]
# A send that is still the same pending send at this many consecutive looks is a stalled reader:
# the cut comes between the limit and 1.25 × the limit.
_LOOKS_PER_LIMIT = 4


def _bytes(chunk: Any) -> bytes:
    # A generate stream's events come framed already (generate/pipeline/stream.py); a chunk
    # object is framed here.
    return chunk if type(chunk) is bytes else frame(chunk)


async def _framed(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    try:
        if first is not None:
            yield _bytes(first)
        async for chunk in rest:
            yield _bytes(chunk)
    except Exception as e:  # an error after the 200 went out can only travel as an event
        error = describe(e)
        log.warning("stream ended with an error event (%d): %s", error.status, error.message)
        yield frame(error_body(error.status, error.message, error.param, error.error_type))
    yield DONE


def sse_response(
    first: Any,
    rest: AsyncIterator[Any],
    headers: dict[str, str] | None = None,
    keep_alive_s: float = 0,
    *,
    stall_limit_s: float,
) -> EventSourceResponse:
    # sep="\n" keeps vLLM's exact framing (sse-starlette defaults to CRLF); ping=0 sends no
    # comment lines unless the operator asks for keep-alives (vLLM: --sse-keep-alive-interval,
    # whose comment is `: keep-alive`).
    return _Stream(
        _framed(first, rest),
        stall_limit_s,
        sep="\n",
        headers=headers,
        ping=keep_alive_s,
        ping_message_factory=_keep_alive,
    )


class _Stream(EventSourceResponse):
    """A client that reads nothing for `stall_limit_s` (DECODE_SERVER_STREAM_SEND_TIMEOUT_S; every
    buffer full, one send pending all along) is cut: the chunks are closed (the engine request is
    aborted, the access line says 499), uvicorn drops the socket. 0: never cut."""

    def __init__(self, content: AsyncIterator[bytes], stall_limit_s: float, **kwargs: Any):
        super().__init__(content, **kwargs)
        self.stall_limit_s = stall_limit_s
        self._sending = False
        self._sent = 0

    async def _send_with_timeout(self, send: Any, message: Any) -> None:
        self._sending = True
        await send(message)
        self._sending = False
        self._sent += 1

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not self.stall_limit_s:
            await super().__call__(scope, receive, send)
            return
        with anyio.CancelScope() as cut:
            watch = asyncio.get_running_loop().create_task(self._watch_for_stall(cut))
            try:
                await super().__call__(scope, receive, send)
            finally:
                watch.cancel()
        if cut.cancelled_caught:
            log.warning("stream cut: its client read nothing for %.0f s", self.stall_limit_s)

    async def _watch_for_stall(self, cut: anyio.CancelScope) -> None:
        stalled_looks, last_sent = 0, -1
        while True:
            await asyncio.sleep(self.stall_limit_s / _LOOKS_PER_LIMIT)
            same_send_pending = self._sending and self._sent == last_sent
            stalled_looks = stalled_looks + 1 if same_send_pending else 0
            last_sent = self._sent
            if stalled_looks >= _LOOKS_PER_LIMIT:
                cut.cancel()
                return


def _keep_alive() -> ServerSentEvent:
    return ServerSentEvent(comment="keep-alive", sep="\n")
