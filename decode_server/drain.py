"""Graceful drain: stop admitting, let in-flight requests finish, abort the rest at the deadline."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sse_starlette.sse import AppStatus

log = logging.getLogger("decode_server.drain")

# sse-starlette would end every open stream the moment uvicorn sees SIGTERM;
# we drain instead and end them ourselves (with a final "abort" chunk) at the deadline.
AppStatus.disable_automatic_graceful_drain()


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_abort: Any = None

    def attach(self, engine: Any, on_abort: Any) -> None:
        self._engine = engine
        self._loop = asyncio.get_running_loop()
        self._on_abort = on_abort

    def begin(self, timeout_s: float) -> None:
        """Called from the signal handler: flip readiness now, schedule the deadline on the loop."""
        if self.draining:
            return
        self.draining = True
        log.info("draining: new requests get 503; in-flight requests have %.0fs", timeout_s)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._deadline(timeout_s)))

    async def _deadline(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)
        if self._engine is None:
            return
        aborted = await self._engine.abort_all()
        if aborted:
            log.info("drain deadline: aborted %d request(s)", len(aborted))
            self._on_abort(len(aborted))
        # Streams end on their abort chunk; anything still open after that is closed by sse-starlette.
        await asyncio.sleep(2)
        AppStatus.should_exit = True
