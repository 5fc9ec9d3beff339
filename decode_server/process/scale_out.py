"""`--api-server-count N` (N > 1): N API processes on one listening socket, sharing one engine core.

Built from vLLM's own multi-API-server parts, in the order `vllm serve`'s `run_multi_api_server`
uses them: `setup_multiprocess_prometheus`, `setup_server` (the listening socket, bound before the
engine), `bind_engine_zmq_listeners` + `launch_core_engines` (the engine core), and
`APIServerProcessManager`, whose `target_server_fn` here is `run_worker`: our app on an AsyncLLM
client of the shared core, accepting on the shared socket as vLLM's workers do (least loaded
first). `wait_for_completion_or_failure` watches the processes.

What is ours: the parent is a supervisor that drains. SIGTERM (or SIGINT) → every API process gets
SIGTERM and drains as one process does (--shutdown-timeout), then the engine core stops and the
parent exits 0. The engine core dying → each API process sees it (a pidfd on the core) and ends its
streams with an error event and exits 1, as one process does; the parent waits for that, then
exits 1. An abort reaches the process holding the request (`peers.py`); /metrics merges every
process (`metrics.py`); every response names its process in `X-Api-Server-Index`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import uvicorn
from vllm.entrypoints.launchers.launcher import NoSignalServer

from decode_server.config import DRAIN_FLUSH_S, ENGINE_DEATH_GRACE_S, ServerConfig
from decode_server.process.engine_session import engine_session
from decode_server.process.server import DrainingServer

INDEX_HEADER = b"x-api-server-index"
# After the engine core dies: how long API processes get to end their streams and exit on their own.
WORKER_EXIT_SLACK_S = 8.0


@dataclass(frozen=True)
class WorkerPlan:
    """What every API process is started with, besides vLLM's (listen address, socket, args, client_config)."""

    config: ServerConfig
    peer_addresses: tuple[str, ...]
    core_pids: tuple[int, ...]
    log_level: str
    log_format: str


class _Stop:
    """SIGTERM/SIGINT in the parent: the first one ends the wait (as vLLM's handler does), once."""

    def __init__(self) -> None:
        self.requested = False
        self.armed = True

    def __call__(self, signum: int, frame: Any) -> None:
        if self.requested:
            return
        self.requested = True
        if self.armed:
            raise SystemExit


def serve(args: argparse.Namespace, config: ServerConfig, log_format: str) -> int:
    """The parent (PID 1 in a container): engine core + N API processes; returns the exit code."""
    from vllm import envs
    from vllm.v1.metrics.prometheus import setup_multiprocess_prometheus

    if envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING:  # as vLLM: adapters would differ between processes
        raise ValueError("VLLM_ALLOW_RUNTIME_LORA_UPDATING cannot be used with api_server_count > 1")
    setup_multiprocess_prometheus()
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        # vLLM's EngineZmqListeners unlinks its ipc paths when it is collected, and the engine
        # core's connects to them are asynchronous: collected early (whenever the cyclic GC ran),
        # the core's output sockets could never connect and every request hung. It lives as long
        # as the server, as in vLLM's run_multi_api_server; the manager's shutdown unlinks them.
        manager, launch, listeners = _launch(args, config, log_format)
        code = _supervise(manager, launch, stop, float(args.shutdown_timeout))
    except SystemExit:
        return 0 if stop.requested else 1  # stopped while starting
    del listeners
    return code


def _launch(args: argparse.Namespace, config: ServerConfig, log_format: str) -> tuple[Any, Any, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.launcher import setup_server
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.network_utils import get_open_zmq_ipc_path
    from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
    from vllm.v1.executor import Executor
    from vllm.v1.utils import APIServerProcessManager

    count = args.api_server_count
    listen_address, sock = setup_server(args, reuse_port=True)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    engine_args.tokens_only = bool(args.tokens_only)
    engine_args._api_process_count, engine_args._api_process_rank = count, -1
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    listeners = bind_engine_zmq_listeners(vllm_config, count)
    log_stats = not engine_args.disable_log_stats
    with contextlib.ExitStack() as launched:
        # The engine core (started as the launch is entered) in a process group of its own; the API
        # processes (started below) stay in ours: a signal to the group reaches them and this
        # process, and each drains.
        with engine_session():
            launch = launched.enter_context(
                launch_core_engines(vllm_config, Executor.get_class(vllm_config), log_stats, listeners.addresses)
            )
        engines = launch.engine_manager
        plan = WorkerPlan(
            config=config,
            peer_addresses=tuple(get_open_zmq_ipc_path() for _ in range(count)),
            core_pids=tuple(p.pid for p in getattr(engines, "processes", ())),
            log_level=(getattr(args, "log_level", None) or "info").lower(),
            log_format=log_format,
        )
        coordinator = launch.coordinator
        manager = APIServerProcessManager(
            listen_address=listen_address,
            sock=sock,
            args=args,
            num_servers=count,
            input_listeners=listeners.inputs,
            output_listeners=listeners.outputs,
            target_server_fn=partial(run_worker, plan),
            stats_update_address=coordinator.get_stats_publish_address() if coordinator else None,
            tensor_queue=launch.tensor_queue,
        )
        launch.watched_frontend_processes = manager.processes
    return manager, launch, listeners


def _supervise(manager: Any, launch: Any, stop: _Stop, shutdown_timeout_s: float) -> int:
    """Until SIGTERM, the engine core's death or an API process's; then stop everything."""
    import logging

    from vllm.v1.utils import wait_for_completion_or_failure

    log = logging.getLogger("decode_server.process.scale_out")
    code = 0
    try:
        wait_for_completion_or_failure(
            api_server_manager=manager, engine_manager=launch.engine_manager, coordinator=launch.coordinator
        )
    except SystemExit:
        log.info("draining %d API server processes (up to %.0fs)", len(manager.processes), shutdown_timeout_s)
    except Exception:  # vLLM has logged which process died
        code = 1
        stop.armed = False
        _join_all(manager.processes, ENGINE_DEATH_GRACE_S + WORKER_EXIT_SLACK_S)
    finally:
        stop.armed = False
        # Each API process drains on SIGTERM; vLLM's manager sends it, waits, then kills what is left.
        drain_s = shutdown_timeout_s + DRAIN_FLUSH_S + 10 if stop.requested else None
        manager.shutdown(timeout=drain_s)
        if launch.engine_manager is not None:
            launch.engine_manager.shutdown()
        if launch.coordinator is not None:
            launch.coordinator.shutdown()
    if any(p.exitcode != 0 for p in manager.processes):
        code = 1
    return code


def _join_all(processes: list[Any], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for proc in processes:
        proc.join(max(0.0, deadline - time.monotonic()))


# ------------------------------------------------------------------ one API process


class BalancedServer(DrainingServer, NoSignalServer):
    """Our draining uvicorn, accepting on the shared socket as vLLM's API workers do: a pending
    connection goes to the process with the fewest open ones (vLLM's `NoSignalServer`). Unlike
    vLLM's, it keeps uvicorn's signal handling: SIGTERM starts the drain."""

    capture_signals = uvicorn.Server.capture_signals  # NoSignalServer's installs none

    def __init__(self, config: Any, lifecycle: Any, peer_loads: Any = None):
        super().__init__(config, lifecycle)
        self.peer_loads = peer_loads


class ServerIndexHeader:
    """ASGI wrapper: every response names the API process that served it."""

    def __init__(self, app: Any, index: int):
        self.app, self._value = app, str(index).encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (INDEX_HEADER, self._value)]}
            await send(message)

        await self.app(scope, receive, send_named)


def run_worker(plan: WorkerPlan, listen_address: str, sock: Any, args: argparse.Namespace, client_config: dict) -> None:
    """One API process (vLLM's `APIServerProcessManager` target): our app on the shared socket."""
    from prometheus_client import multiprocess
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.system_utils import decorate_logs, set_process_title

    from decode_server.runtime.access_log import configure as configure_logging
    from decode_server.http.app import build_app
    from decode_server.runtime.engine import Engine
    from decode_server.runtime.peers import Peers
    from decode_server.process.server import Lifecycle, run, uvicorn_config

    index = client_config["client_index"]
    set_process_title("APIServer", str(index))
    decorate_logs()
    configure_logging(plan.log_level, plan.log_format)
    if args.tool_parser_plugin:
        from vllm.tool_parsers import ToolParserManager

        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    loads = client_config.pop("api_server_loads", None)
    client = {**client_config, "core_pids": plan.core_pids}
    engine_args = AsyncEngineArgs.from_cli_args(args)
    lifecycle = Lifecycle(args.shutdown_timeout)
    app = build_app(
        lambda: Engine.start(engine_args, tokens_only=args.tokens_only, client=client),
        plan.config,
        lifecycle,
        Peers(index, list(plan.peer_addresses)),
    )
    server_class = partial(BalancedServer, peer_loads=(loads, index)) if loads is not None else None
    code = run(uvicorn_config(ServerIndexHeader(app, index), args, plan.config), lifecycle, sockets=[sock], server_class=server_class)
    multiprocess.mark_process_dead(os.getpid())
    sys.exit(code)
