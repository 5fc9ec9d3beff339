"""The processes of a real server under test: its engine cores, and its end on SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import psutil

from tests.support.servers import Server


def wait_ended(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Waits until every process has exited; returns those still running after `timeout_s`.

    A process whose parent dies first is handed to a reaper (PID 1, or a subreaper), and until
    that reaps it, it is a zombie: exited (no code runs, its memory and sockets are freed) but still
    in the process table, which `psutil.wait_procs` counts as alive for a process that is not its
    caller's child. This machine's PID 1 reaps late: an engine core that ended within a second of
    its server's SIGKILL was still a zombie 30 s later."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = [p for p in procs if _running(p)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.1)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def engine_cores(server: Server) -> list[psutil.Process]:
    children = psutil.Process(server.proc.pid).children(recursive=True)
    cores = [p for p in children if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())]
    assert cores, [p.name() for p in children]
    return cores


def detached_engine_cores(server: Server) -> list[psutil.Process]:
    """Its engine cores, each asserted to lead a process group of its own (so a signal to the
    server's process group misses them) in the server's session (so they share its CPU scheduling
    group: decode_server/process/engine_session.py)."""
    cores = engine_cores(server)
    for core in cores:
        assert os.getpgid(core.pid) == core.pid != os.getpgid(server.proc.pid), core
        assert os.getsid(core.pid) == os.getsid(server.proc.pid), core
    return cores


def signal_all(server: Server, sig: int) -> None:
    """To the server and every process under it: its engine processes are in a process group of their own
    (decode_server/process/engine_session.py), so a signal to its process group misses them."""
    if server.proc is None or server.proc.poll() is not None:
        return
    top = psutil.Process(server.proc.pid)
    for proc in [top, *top.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)


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
    alive = wait_ended(children, 30)
    return code, elapsed, alive
