"""The in-process tier on a real socket: uvicorn in a background thread serving `inprocess.serve`'s
app (the real app over the scripted engine) on a loopback port.

For what needs a socket: the sync clients, schemathesis calling a URL, timing seen by a real
reader (keep-alive comments), the comparisons with vLLM's own server written against URLs
(`vllms=True` serves vLLM's API server over the scripted engine instead, `inprocess.vllm_serve`). uvicorn runs with the production configuration (`uvicorn_config`:
our HTTP protocol class, keep-alive and header limits); the app's lifespan has already run in
`serve`, so uvicorn's is off. The engine lives in the server thread's event loop: touch the
scripted core through `call` (a function run in that loop) and `wait` (a coroutine awaited there).

    with loopback(demo_model, "--api-key", "k") as srv:
        gate = srv.call(srv.core.hold, "req-1", 1)
        httpx.post(srv.url + GENERATE, ...)  # from any thread
        srv.wait(gate.reached()); srv.call(gate.release)
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from decode_server.process.server import DrainingServer, uvicorn_config
import uvicorn

from tests.support.inprocess import InProcess, serve, vllm_serve
from tests.support.scripted_engine import ScriptedCore

T = TypeVar("T")
START_TIMEOUT_S = 300.0  # a bound: the first start imports vLLM and builds its parser (seconds; minutes on a loaded machine)


@dataclass
class Loopback:
    url: str
    inproc: InProcess
    loop: asyncio.AbstractEventLoop
    server: uvicorn.Server
    name: str = "loopback"

    @property
    def core(self) -> ScriptedCore:
        return self.inproc.core

    def wait(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        """Await `coro` in the server's loop, from the test's thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn` in the server's loop (the scripted core's hooks are not thread-safe)."""

        async def run() -> T:
            return fn(*args, **kwargs)

        return self.wait(run())

    def metric(self, name: str, **labels: str) -> float:
        return self.wait(self.inproc.metric(name, **labels))


def _our_server(inproc: InProcess) -> DrainingServer:
    config = uvicorn_config(inproc.app, inproc.args, inproc.state.config)
    config.lifespan = "off"
    # Our uvicorn, tied to the app's lifecycle as `server.run` ties them (its signal handler
    # is not installed off the main thread: a test calls `handle_exit`).
    server = DrainingServer(config, inproc.lifecycle)
    inproc.lifecycle._server = server
    return server


def _vllms_server(inproc: InProcess) -> uvicorn.Server:
    # What `vllm serve` hands uvicorn, bar the options no test here reaches (TLS, h11 limits).
    return uvicorn.Server(uvicorn.Config(inproc.app, lifespan="off", log_level="warning", timeout_keep_alive=5))


@contextlib.contextmanager
def loopback(model_dir: Path, *flags: str, vllms: bool = False) -> Iterator[Loopback]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    started: dict[str, Any] = {}
    ready = threading.Event()

    async def main() -> None:
        async with (vllm_serve if vllms else serve)(model_dir, *flags) as inproc:
            server = _vllms_server(inproc) if vllms else _our_server(inproc)
            name = "vllm-loopback" if vllms else "loopback"
            started.update(server=server, srv=Loopback(url, inproc, asyncio.get_running_loop(), server, name))
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started and not serving.done():
                await asyncio.sleep(0.01)
            ready.set()
            await serving

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the starting thread, not lost in this one
            started["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="loopback-server", daemon=True)
    thread.start()
    try:
        if not ready.wait(START_TIMEOUT_S) or "error" in started or not started["server"].started:
            raise RuntimeError(f"the loopback server did not start: {started.get('error')!r}") from started.get("error")
        yield started["srv"]
    finally:
        if "server" in started:
            started["server"].should_exit = True
        thread.join(START_TIMEOUT_S)
        sock.close()
    assert not thread.is_alive(), "the loopback server did not stop"
    if "error" in started:
        raise RuntimeError("the loopback server failed while serving") from started["error"]
