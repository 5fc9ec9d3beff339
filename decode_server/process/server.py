"""The process lifecycle: uvicorn, the drain on SIGTERM, the engine watchdog and the exit code.

`Lifecycle` is the one object that knows whether the process is draining, whether the
engine died and when to exit; the app reads it (readiness, admission), the lifespan
attaches the engine to it, and `run()` serves until it says stop.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from typing import Any

import uvicorn
from sse_starlette.sse import AppStatus
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from decode_server.config import (
    DEFAULT_HOST,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    DRAIN_FLUSH_S,
    DRAIN_POLL_S,
    ENGINE_DEATH_GRACE_S,
    ENGINE_WATCH_INTERVAL_S,
    ServerConfig,
)

log = logging.getLogger("decode_server.process.server")


class Lifecycle:
    def __init__(self, shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S):
        self.shutdown_timeout_s = shutdown_timeout_s
        self.draining = False
        self.engine_died = False
        self._engine: Any = None
        self._metrics: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def exit_code(self) -> int:
        # Non-zero after an engine death so Kubernetes (or any supervisor) restarts the pod;
        # a completed drain is a clean exit.
        return 1 if self.engine_died else 0

    def attach(self, engine: Any, metrics: Any) -> None:
        """Called from the app's lifespan, on the serving loop, once the engine is up."""
        self._engine, self._metrics = engine, metrics
        self._loop = asyncio.get_running_loop()
        self._spawn(self._watch_engine())

    def detach(self) -> None:
        for task in self._tasks:
            task.cancel()

    def begin_drain(self) -> bool:
        """From the signal handler: flip readiness now, hand the rest to the loop. False when
        there is nothing to drain yet (no engine attached: the signal came during start-up)."""
        if self._loop is None:
            return False
        if not self.draining:
            self.draining = True
            # Nothing more here: a Python signal handler runs on the main thread between any two
            # bytecodes of whatever it interrupted (a log write, a task step); the log line and
            # the drain task are the loop's, run by this callback.
            self._loop.call_soon_threadsafe(self._start_drain)
        return True

    def _start_drain(self) -> None:
        log.info("draining: new requests get 503; in-flight requests have %.0fs", self.shutdown_timeout_s)
        self._spawn(self._drain())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _busy(self) -> bool:
        return self._engine.live_request_count() > 0 or self._metrics.server_load > 0

    async def _drained(self) -> None:
        while self._busy():
            await asyncio.sleep(DRAIN_POLL_S)

    async def _drain(self) -> None:
        """The server keeps listening while it drains (/metrics, /ready's 503, new requests' 503),
        and stops once no request is in flight, or at the deadline after aborting the rest."""
        drained = asyncio.ensure_future(self._drained())
        try:
            await asyncio.wait_for(asyncio.shield(drained), self.shutdown_timeout_s)
        except asyncio.TimeoutError:
            aborted = await self._engine.abort_all()
            if aborted:
                log.info("drain deadline: aborted %d request(s)", len(aborted))
                self._metrics.aborted("drain", len(aborted))
            # Streams end on their abort chunk; anything still open after that is closed by sse-starlette.
            await asyncio.sleep(DRAIN_FLUSH_S)
            AppStatus.should_exit = True
        finally:
            drained.cancel()
        self._stop_serving()

    def _stop_serving(self) -> None:
        if self._server is not None:
            self._server.should_exit = True

    async def _watch_engine(self) -> None:
        """When the engine core dies: /health is already 503; let open streams send their
        error events, then exit non-zero."""
        while not self._engine.is_dead:
            await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
        log.error("the engine core died; open streams end with an error event and the server exits")
        self.engine_died = True
        await asyncio.sleep(ENGINE_DEATH_GRACE_S)
        self._stop_serving()


class DrainingServer(uvicorn.Server):
    """uvicorn, plus: the first SIGTERM/SIGINT starts the drain before uvicorn stops listening."""

    # Set by `run` (a server process), not where a test serves the app in its own process.
    freezes_startup_heap = False

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle):
        super().__init__(config)
        self.lifecycle = lifecycle

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.freezes_startup_heap and not self.should_exit:
            # As vLLM's own API server does once its app has started: what start-up built (vLLM,
            # torch, the tokenizer, the engine client, the app) leaves the collector's view. A
            # collection of the oldest generation otherwise walks all of it, ~0.4 s here with the
            # event loop stalled, about once per thousand requests (docs/benchmarks.md).
            from vllm.utils.gc_utils import freeze_gc_heap

            freeze_gc_heap()

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        await super().shutdown(sockets=sockets)
        if self.freezes_startup_heap:
            # The interpreter's exit collects the start-up heap as any other: frozen, Triton's
            # bindings are still alive at their leak check, which writes a report past our logging.
            gc.unfreeze()

    def handle_exit(self, sig: int, frame: Any) -> None:
        # The first signal starts the drain and uvicorn keeps listening (Prometheus still scrapes
        # the draining process; new requests get 503); the lifecycle stops it once drained.
        # Again SIGTERM: nothing more; again SIGINT (Ctrl+C twice): uvicorn's own shutdown.
        already = self.lifecycle.draining
        if self.lifecycle.begin_drain() and (not already or sig != signal.SIGINT):
            return
        super().handle_exit(sig, frame)
        # uvicorn re-raises the captured signal after shutdown, so the process would die
        # by SIGTERM; a completed drain is a clean exit (0) for Kubernetes and supervisors.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()


class _HeadTimeoutProtocol(AutoHTTPProtocol):
    """uvicorn's HTTP protocol (httptools, else h11) plus a bound uvicorn lacks: a request head must
    be complete `head_timeout_s` after the connection opens, or after the first byte of a
    kept-alive connection's next request, else the connection is closed. (uvicorn times out only
    idle kept-alive connections; a client sending its headers byte by byte would be held forever.)"""

    head_timeout_s = 0.0  # set by `bounded`; 0: no bound
    _head_timer: asyncio.TimerHandle | None = None

    @classmethod
    def bounded(cls, head_timeout_s: float) -> type[_HeadTimeoutProtocol]:
        """The protocol class uvicorn instantiates per connection, with this bound."""
        return type(cls.__name__, (cls,), {"head_timeout_s": head_timeout_s})

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self._between_requests():
            self._arm_head_timer()
        super().data_received(data)
        if self._head_timer is not None and not self._between_requests():
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        if self.head_timeout_s > 0:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._between_requests() and not self.transport.is_closing():
            log.debug("closing a connection whose request head took over %.0f s", self.head_timeout_s)
            self.transport.close()


def uvicorn_config(app: Any, args: Any, server_config: ServerConfig) -> uvicorn.Config:
    """uvicorn as `vllm serve` configures it, from the same flags; plus our request-head bound."""
    from vllm import envs

    config = uvicorn.Config(
        app,
        host=DEFAULT_HOST if args.host is None else args.host,
        port=args.port,
        uds=args.uds,
        root_path=args.root_path or "",
        loop="uvloop",
        http=_HeadTimeoutProtocol.bounded(server_config.request_head_timeout_s),
        log_level=args.uvicorn_log_level,
        log_config=None,  # keep our handler/format for uvicorn's loggers too
        access_log=False,  # our access line (decode_server.access) carries request ids and tokens
        timeout_keep_alive=envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
        # The drain aborts what is left at the shutdown timeout; this only bounds a stuck connection.
        timeout_graceful_shutdown=int(args.shutdown_timeout) + 10,
        ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile,
        ssl_ca_certs=args.ssl_ca_certs,
        ssl_cert_reqs=args.ssl_cert_reqs,
        ssl_ciphers=args.ssl_ciphers or "TLSv1",
        # Header limits as vLLM sets them (CVE-2025-48956).
        h11_max_incomplete_event_size=args.h11_max_incomplete_event_size,
    )
    config.h11_max_header_count = args.h11_max_header_count
    return config


def run(config: uvicorn.Config, lifecycle: Lifecycle, sockets: list[Any] | None = None, server_class: Any = None) -> int:
    """Serve until drained or the engine died; return the process exit code. `sockets`: already
    bound listening sockets (an API process of --api-server-count N); `server_class`: a
    `DrainingServer` subclass to run instead."""
    # sse-starlette would end every open stream the moment uvicorn sees SIGTERM;
    # the drain ends them instead (with a final "abort" chunk) at the deadline.
    AppStatus.disable_automatic_graceful_drain()
    server = (server_class or DrainingServer)(config, lifecycle)
    server.freezes_startup_heap = True
    lifecycle._server = server
    server.run(sockets=sockets)
    return lifecycle.exit_code
