"""The processes of a real server under test: its engine cores, and its end on SIGTERM."""

from __future__ import annotations

import signal
import threading
import time

import psutil

from tests.servers import Server


def engine_cores(server: Server) -> list[psutil.Process]:
    children = psutil.Process(server.proc.pid).children(recursive=True)
    cores = [p for p in children if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())]
    assert cores, [p.name() for p in children]
    return cores


def sigterm_and_wait(server: Server, readers: list[threading.Thread]) -> tuple[int, float, list[psutil.Process]]:
    """SIGTERM; once every reader has ended: (exit code, seconds to exit, the processes the server
    had that outlived it: an API process, an engine core)."""
    children = psutil.Process(server.proc.pid).children(recursive=True)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    for reader in readers:
        reader.join(120)
    code = server.proc.wait(120)
    elapsed = time.monotonic() - started
    _, alive = psutil.wait_procs(children, timeout=30)
    return code, elapsed, alive
