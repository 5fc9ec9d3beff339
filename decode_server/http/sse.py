"""SSE through sse-starlette: the stream's events (framed where its engine step is processed, generate/pipeline/stream.py), an error event, then `[DONE]`.

sse-starlette's `EventSourceResponse` runs the response: its task group, the disconnect listener
that cancels the stream, keep-alive comments, the end at shutdown. Its per-event loop is ours
(`_Stream._stream_response`): one ASGI send per event and nothing else on that path. sse-starlette's
loop re-encodes each event (`ensure_bytes`), logs it at debug, and its send timeout opens an anyio
cancel scope with a timer around every send. Ours, with its events sent below Starlette's per-send
wrappers (BODY_SEND), cost ~4 µs less per event at the engine's cadence than sse-starlette's loop
through those wrappers (`python -m bench.sse_cost --variants ours,sse-starlette-loop,bare`). A
stalled reader is caught instead by one watch per stream that looks at the send in progress a few
times per limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from sse_starlette.sse import EventSourceResponse, ServerSentEvent
from starlette.responses import Response

from decode_server.errors import describe
from decode_server.generate.pipeline.frames import DONE, frame
from protocol.errors import error_body

log = logging.getLogger("decode_server.http.sse")

__all__ = ["BODY_SEND", "DONE", "frame", "sse_response"]
# The server's own ASGI send, put into the scope by the app (http/app.py) where no operator
# middleware wraps send: Starlette's wrappers (its error and exception middleware, CORS) act on a
# response's start only, so a stream's events skip their four calls each.
BODY_SEND = "decode_server.body_send"
# A send that is still the same pending send at this many consecutive looks is a stalled reader:
# the cut comes between the limit and 1.25 × the limit.
_LOOKS_PER_LIMIT = 4
# How long closing the events' iterator may take after the stream was cut short (sse-starlette's default).
_CLOSE_LIMIT_S = EventSourceResponse.DEFAULT_CLEANUP_TIMEOUT


def _error_event(e: Exception) -> bytes:
    error = describe(e)
    log.warning("stream ended with an error event (%d): %s", error.status, error.message)
    return frame(error_body(error.status, error.message, error.param, error.error_type))


def sse_response(
    first: bytes | None,
    rest: AsyncIterator[bytes],
    headers: dict[str, str] | None = None,
    keep_alive_s: float = 0,
    *,
    stall_limit_s: float,
    refused: Callable[[Exception], Awaitable[Response]] | None = None,
) -> EventSourceResponse:
    """`first`, then `rest`'s events. With `refused`, the first item of `rest` is the stream's head
    instead (bytes or None): the response is set up at once, and answers only once the head has
    come: 200 and the stream, or `refused(e)`'s answer if the head raised `e`."""
    # sep="\n" keeps vLLM's exact framing (sse-starlette defaults to CRLF); ping=0 sends no
    # comment lines unless the operator asks for keep-alives (vLLM: --sse-keep-alive-interval,
    # whose comment is `: keep-alive`).
    return _Stream(
        first,
        rest,
        stall_limit_s,
        refused,
        sep="\n",
        headers=headers,
        ping=keep_alive_s,
        ping_message_factory=_keep_alive,
    )


class _Stream(EventSourceResponse):
    """`first` (None: nothing) and `rest`'s events, then an error event if `rest` raised, then
    `[DONE]`. A client that reads nothing for `stall_limit_s` (DECODE_SERVER_STREAM_SEND_TIMEOUT_S;
    every buffer full, one send pending all along) is cut: the events' iterator is closed (the
    engine request is aborted, the access line says 499), uvicorn drops the socket. 0: never cut."""

    def __init__(self, first: bytes | None, rest: AsyncIterator[bytes], stall_limit_s: float,
                 refused: Callable[[Exception], Awaitable[Response]] | None, **kwargs: Any):
        super().__init__(rest, **kwargs)
        self._first = first
        self.stall_limit_s = stall_limit_s
        self._refused = refused
        # A keep-alive comment waits for the start (the head may take a long prefill).
        self._started = anyio.Event() if refused is not None and self._ping_interval > 0 else None
        self._sending = False
        self._sent = 0
        self._body_send: Any = None
        self._scope: Any = None  # (scope, receive), for a refusal's response

    async def _stream_response(self, send: Any) -> None:
        rest = self.body_iterator
        first = self._first
        if self._refused is not None:
            # Cancelled here (the client left): the head's own cleanup has aborted the engine request.
            try:
                first = await anext(rest)
            except Exception as e:
                await (await self._refused(e))(*self._scope, send)
                self.active = False
                return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        self._response_started = True
        if self._started is not None:
            self._started.set()
        send = self._body_send or send
        try:
            if first is not None:
                await self._send_event(send, first)
            try:
                async for events in rest:
                    # _send_with_timeout inlined: this is the per-token path
                    self._sending = True
                    await send({"type": "http.response.body", "body": events, "more_body": True})
                    self._sending = False
                    self._sent += 1
            except Exception as e:  # an error after the 200 went out can only travel as an event
                if self._sending:  # the send failed, not the stream
                    raise
                await self._send_event(send, _error_event(e))
        except BaseException:
            self._send_interrupted = self._sending
            await _close(rest)
            raise
        async with self._send_lock:  # a keep-alive comment is not sent into the end of the stream
            await self._send_event(send, DONE, more_body=False)
            self._response_complete = True
            self.active = False

    async def _send_event(self, send: Any, body: bytes, more_body: bool = True) -> None:
        await self._send_with_timeout(send, {"type": "http.response.body", "body": body, "more_body": more_body})

    async def _send_with_timeout(self, send: Any, message: Any) -> None:
        # Every send of the stream is watched for a stalled reader: events, keep-alive comments,
        # the end after the exit signal.
        self._sending = True
        await send(message)
        self._sending = False
        self._sent += 1

    async def _ping(self, send: Any) -> None:
        if self._started is not None:
            await self._started.wait()
        await super()._ping(send)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self._body_send = scope.get(BODY_SEND)
        self._scope = (scope, receive)
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


async def _close(events: AsyncIterator[Any]) -> None:
    """A stream cut short (disconnect, stall cut, a failed send) closes its events, so their
    cleanup (the engine request's abort) runs before the response ends; shielded, because the
    cut is a cancellation."""
    aclose = getattr(events, "aclose", None)
    if aclose is None:
        return
    with anyio.move_on_after(_CLOSE_LIMIT_S, shield=True) as scope:
        try:
            await aclose()
        except Exception:
            log.exception("closing a stream's events failed")
    if scope.cancel_called:
        log.warning("closing a stream's events took over %.0f s; left", _CLOSE_LIMIT_S)


def _keep_alive() -> ServerSentEvent:
    return ServerSentEvent(comment="keep-alive", sep="\n")
