"""A server process leaves its start-up heap out of the garbage collector's view once its app has
started, as vLLM's own API server does (`process/server.py`); an app served inside a test process
(the in-process and loopback tiers) does not, so no test freezes another's objects."""

from __future__ import annotations

import gc
from typing import Any

import uvicorn
from sse_starlette.sse import AppStatus

from decode_server.process.server import DrainingServer, Lifecycle, run


async def _lifespan_only(scope: Any, receive: Any, send: Any) -> None:
    assert scope["type"] == "lifespan"
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class _StopsOnceStarted(DrainingServer):
    """Notes what the app's start left frozen, then stops at once."""

    frozen_at_start: int | None = None

    async def startup(self, sockets: list[Any] | None = None) -> None:
        started_with = gc.get_freeze_count()
        await super().startup(sockets=sockets)
        self.frozen_at_start = gc.get_freeze_count() - started_with
        gc.unfreeze()  # the test process's heap is its own again
        self.should_exit = True


def _config() -> uvicorn.Config:
    return uvicorn.Config(_lifespan_only, host="127.0.0.1", port=0, lifespan="on", log_config=None)


def test_a_server_process_freezes_its_start_up_heap_once_its_app_has_started():
    gc.unfreeze()
    servers: list[_StopsOnceStarted] = []

    def noted(config: uvicorn.Config, lifecycle: Lifecycle) -> _StopsOnceStarted:
        servers.append(_StopsOnceStarted(config, lifecycle))
        return servers[-1]

    drains_streams_itself = AppStatus.enable_automatic_graceful_drain
    try:
        assert run(_config(), Lifecycle(), server_class=noted) == 0
    finally:  # `run` hands sse-starlette's end of streams to the drain, process-wide
        AppStatus.enable_automatic_graceful_drain = drains_streams_itself
    assert servers[0].frozen_at_start > 0


def test_an_app_served_in_a_test_process_leaves_the_heap_alone():
    gc.unfreeze()
    server = _StopsOnceStarted(_config(), Lifecycle())
    server.run()
    assert server.frozen_at_start == 0
