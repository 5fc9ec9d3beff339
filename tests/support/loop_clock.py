"""The running event loop's clock, moved by the test.

A deadline that hangs on `asyncio.sleep` (the drain's, the stall watch's) fires when the test
advances the clock past it, not when the wall clock gets there: what happens before a deadline and
what happens at it are then ordered by the test, on any machine, at the production values.

Real time still passes as usual, except inside `frozen()`: there the loop's time moves only when
the test advances it, so a loaded machine's pauses cannot move a deadline relative to what the test
checks. Every timer of the loop is on this clock (in-process tests have none that matter beyond
the app's: httpx applies no timeouts to an ASGI transport).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest


class LoopClock:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._real = loop.time
        self._offset = 0.0
        self._frozen_at: float | None = None
        loop.time = self.time  # type: ignore[method-assign]  # call_later/sleep read loop.time()

    def time(self) -> float:
        return self._frozen_at if self._frozen_at is not None else self._real() + self._offset

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Only `advance` moves the clock inside; it goes on from where it stopped afterwards."""
        self._frozen_at = self.time()
        try:
            yield
        finally:
            self._offset = self._frozen_at - self._real()
            self._frozen_at = None

    async def advance(self, seconds: float) -> None:
        """Move the clock forward, then let every callback that came due run."""
        if self._frozen_at is not None:
            self._frozen_at += seconds
        else:
            self._offset += seconds
        for _ in range(20):  # a due timer's callback may wake a task that awaits the next one
            await asyncio.sleep(0)

    def close(self) -> None:
        """Back to the wall clock: `offset` seconds back in time, so only once nothing of the test
        waits on a timer (timers set meanwhile would fire that much later)."""
        del self._loop.time  # the class's method again


@pytest.fixture
async def clock():
    """A test's LoopClock. Ask for it before `inproc`, so that it is put back after the app is gone
    (time must not run backwards under timers the app still has); import it into the test module."""
    loop_clock = LoopClock(asyncio.get_running_loop())
    yield loop_clock
    loop_clock.close()
