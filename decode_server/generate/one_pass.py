"""One pass per engine step for every live stream, on vLLM's AsyncLLM (issue #30).

vLLM's output handler processes an engine step in one synchronous run: its OutputProcessor
(detokenizer, stop strings, n > 1, aborts) puts each request's RequestOutput into the request's
collector, and `generate()` is a task per request woken by that put. Here a put only marks the
stream (`compat.on_put`), and the step's first mark schedules one pass (`loop.call_soon`: it
runs once the handler yields, so after every put of the step). The pass drains each marked
collector once (`get_nowait`: whatever vLLM merged into it since), runs the stream's stages as
plain calls (generate/pipeline/stream.py) and appends the framed events to the stream's buffer.
A stream's writer (the SSE response) wakes only when its buffer has bytes, and sends it all.

A stream whose buffer holds `BUFFER_LIMIT` bytes (its reader is slow or stalled) is not drained:
its output stays in vLLM's collector, which merges what comes meanwhile (as it does for a
`generate()` task that lags), until its writer has taken the buffer; the stall cut is sse.py's.
An engine error reaches every collector (vLLM's `propagate_error`) and so ends each stream in
the same pass with the error `generate()` would have raised. A stream whose writer leaves
(disconnect, stall cut) is aborted there and then, as `generate()` aborts a cancelled request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import anyio
from vllm.v1.engine.exceptions import EngineGenerateError

from decode_server.compat import GENERATE_DOES_NOT_ABORT, GENERATE_RAISES_AS_IS, on_put
from decode_server.generate.pipeline.stream import StreamPipeline
from decode_server.runtime.engine import Engine, EngineRequest, EngineStream
from decode_server.runtime.metrics import Metrics

log = logging.getLogger("decode_server.generate.one_pass")

# A stream buffers at most this much before its collector is left to vLLM's merging: some
# hundred events, so a reader that keeps up never meets it, and one that does not costs no more.
BUFFER_LIMIT = 256 * 1024
# How long a stream's abort may hold its end (it is one message to the engine core).
ABORT_LIMIT_S = 5.0


class StepConsumer:
    """The one consumer: marks streams as vLLM puts their outputs, drains them once per step."""

    def __init__(self, metrics: Metrics):
        self._metrics = metrics
        self._marked: list[OnePassStream] = []
        self._scheduled = False

    def mark(self, stream: OnePassStream) -> None:
        if stream.marked:  # n > 1: each child's output is a put into the same collector
            return
        stream.marked = True
        self._marked.append(stream)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._pass)

    def _pass(self) -> None:
        self._scheduled = False
        marked, self._marked = self._marked, []
        wakeups = 0
        for stream in marked:
            stream.marked = False
            wakeups += stream.drain()
        self._metrics.stream_passes.inc()
        if wakeups:
            self._metrics.stream_wakeups.inc(wakeups)


class OnePassStream:
    """One stream: its engine request's collector, its stages, its byte buffer and its writer."""

    __slots__ = ("_consumer", "_engine", "_request", "_pipeline", "_engine_stream", "_buffer", "_waiter",
                 "_error", "_ended", "_engine_done", "_backlogged", "_buffered_tokens", "marked")

    def __init__(self, consumer: StepConsumer, engine: Engine, request: EngineRequest, pipeline: StreamPipeline):
        self._consumer, self._engine, self._request, self._pipeline = consumer, engine, request, pipeline
        self._engine_stream: EngineStream | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future | None = None
        self._error: BaseException | None = None
        self._ended = False  # nothing more comes: the engine finished it, or it failed
        self._engine_done = False  # the engine holds nothing of it (finished, or vLLM dropped it)
        self._backlogged = False
        self._buffered_tokens = 0  # the completion tokens whose events are in the buffer or sent
        self.marked = False

    # ------------------------------------------------------------ the consumer's side

    def drain(self) -> int:
        """Takes the collector's output through the stages. Returns 1 if that woke the writer."""
        if self._ended:
            return 0
        if len(self._buffer) >= BUFFER_LIMIT:
            self._backlogged = True
            return 0
        try:
            output = self._engine_stream.collector.get_nowait()
        except Exception as e:  # vLLM put an error (a dead engine, its output handler failed)
            self._end_with(as_generate_raises(e), engine_done=isinstance(e, GENERATE_DOES_NOT_ABORT))
            return self._wake()
        if output is None:
            return 0
        try:
            data = self._pipeline.frames(output)
            if output.finished:
                data += self._pipeline.tail()
                self._ended = self._engine_done = True
        except Exception as e:  # a stage failed: its error as it is, the request aborted
            self._end_with(e, engine_done=False)
            return self._wake()
        if not data and not self._ended:
            return 0
        self._buffer += data
        self._buffered_tokens = self._pipeline.tokens
        return self._wake()

    def _end_with(self, error: BaseException, *, engine_done: bool) -> None:
        self._ended, self._error, self._engine_done = True, error, engine_done

    def _wake(self) -> int:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return 0
        waiter.set_result(None)
        return 1

    # ------------------------------------------------------------ the writer's side

    async def events(self) -> AsyncIterator[bytes]:
        """The stream's framed events, one block per wake; raises what ended it, if anything did."""
        try:
            engine_stream = self._engine_stream = await self._engine.open(self._request)
        except Exception as e:
            error = as_generate_raises(e)
            if error is e:
                raise
            raise error from e
        try:
            on_put(engine_stream.collector, lambda: self._consumer.mark(self))
            while True:
                while not self._buffer:
                    if self._ended:
                        if self._error is not None:
                            raise self._error
                        return
                    self._waiter = asyncio.get_running_loop().create_future()
                    try:
                        await self._waiter
                    finally:
                        self._waiter = None
                data = bytes(self._buffer)
                self._buffer.clear()
                self._pipeline.sent(self._buffered_tokens)
                if self._backlogged:  # the consumer left its output in the collector: take it now
                    self._backlogged = False
                    self._consumer.mark(self)
                yield data
        finally:
            self._ended = True
            await self._close(engine_stream)

    async def _close(self, engine_stream: EngineStream) -> None:
        try:
            if not self._engine_done:  # its writer left, or a stage failed: as generate() aborts
                # Shielded: a stream whose client left before its head is cancelled by its response
                # (anyio delivers that again at every await), and the abort must reach the engine.
                with anyio.move_on_after(ABORT_LIMIT_S, shield=True) as scope:
                    await engine_stream.abort()
                if scope.cancel_called:
                    log.warning("aborting request %s took over %.0f s; left", engine_stream.engine_id, ABORT_LIMIT_S)
        finally:
            engine_stream.release()


def as_generate_raises(e: BaseException) -> BaseException:
    """The error vLLM's `generate()` raises for `e` (from adding the request, or put into its
    collector); anything it does not raise as it is, it raises as EngineGenerateError."""
    if isinstance(e, (*GENERATE_RAISES_AS_IS, asyncio.CancelledError)) or not isinstance(e, Exception):
        return e
    wrapped = EngineGenerateError()
    wrapped.__cause__ = e
    return wrapped
