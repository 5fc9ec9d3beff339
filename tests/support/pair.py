"""Our app and vLLM 0.33's own API server, in process over the same scripted engine outputs, kept
for the whole 0.33 session: building an app pair costs seconds (vLLM's app state, its heap freeze),
a request milliseconds. Both run in one event loop, in a host task that entered their contexts
(lifespans and clients are left in the task that entered them); tests run their coroutines on
that loop with `Pair.run`."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.support.inprocess import InProcess, serve, vllm_serve

T = TypeVar("T")


@dataclass
class Pair:
    ours: InProcess
    theirs: InProcess
    loop: asyncio.AbstractEventLoop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)


def serving_pair(model_dir: Path, *flags: str) -> Iterator[Pair]:
    """A generator for a fixture: the pair for `serve`/`vllm serve MODEL *ENGINE_FLAGS *flags`."""
    loop = asyncio.new_event_loop()
    ready: asyncio.Future[Pair] = loop.create_future()
    stop = asyncio.Event()

    async def host() -> None:
        try:
            async with serve(model_dir, *flags) as ours, vllm_serve(model_dir, *flags) as theirs:
                ready.set_result(Pair(ours, theirs, loop))
                await stop.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e)
            raise

    hosting = loop.create_task(host())
    try:
        yield loop.run_until_complete(ready)
    finally:
        stop.set()
        loop.run_until_complete(hosting)
        # What the apps left running (sse-starlette's shutdown watcher): cancelled, as asyncio.run does.
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
