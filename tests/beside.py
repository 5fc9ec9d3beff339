"""Pytest sessions of their own, run beside the suite: one process at a time, in the order they were
started, on a background thread of the suite's process.

The in-process tests are single-threaded and the machine has two cores: a session that shares
nothing with the main one (another vLLM's modules, or a CPU-bound module of the in-process tier)
runs on the second core while the main session goes on. The test that stands for it in the main
session waits for its verdict (`failure`) and fails with its output; a main session that ends first
(`-x`, Ctrl+C) stops them (`stop_all`)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 1200
# Path of a module -> the node ids of its tests that conftest moved out of the main session into a
# session beside it (a module that stands for them names the path in `MOVES_BESIDE`).
MOVED = pytest.StashKey[dict[str, list[str]]]()


class CannotRun(Exception):
    """Why a session could not be started (the waiting test fails with it)."""


class Session:
    """`pytest ARGS -q` in a process of its own, with the environment `env()` returns (it may
    raise `CannotRun`)."""

    def __init__(self, name: str, env: Callable[[], dict[str, str]]):
        self.name = name
        self._env = env
        self._args: list[str] = []
        self._started = False
        self._done = threading.Event()
        self._failure = ""
        self._proc: subprocess.Popen | None = None
        self._stopped = False
        self._lock = threading.Lock()
        # When its process started and ended (time.time()): whether it overlapped a module's timed
        # checks is read off these (conftest's terminal summary prints them).
        self.ran: tuple[float, float] | None = None
        _sessions.append(self)

    def start(self, args: list[str]) -> Session:
        """Queued once per main session; later calls return it as it is."""
        with self._lock:
            if not self._started:
                self._started = True
                self._args = list(args)
                _queue().put(self)
        return self

    def running(self) -> bool:
        """Started this session and not finished (queued counts as running)."""
        return self._started and not self._done.is_set()

    def failure(self) -> str:
        """Waits for the session: why it failed, or "" when it passed."""
        if not self._done.wait(2 * TIMEOUT_S + 600):  # it may wait for one queued before it
            return f"{self.name} gave no verdict in {2 * TIMEOUT_S + 600} s"
        return self._failure

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()

    def run(self) -> None:
        try:
            self._failure = self._verdict()
        except Exception as e:  # the waiting test reports it, whatever it was
            self._failure = f"{self.name} could not run: {e!r}"
        finally:
            self._done.set()

    def _verdict(self) -> str:
        try:
            env = self._env()
        except CannotRun as e:
            return str(e)
        with tempfile.TemporaryFile("w+") as out:
            with self._lock:
                if self._stopped:
                    return "stopped before it ran"
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "pytest", *self._args, "-q", "-p", "no:cacheprovider"],
                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                )
            began = time.time()
            try:
                code = self._proc.wait(TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                code = f"killed after {TIMEOUT_S} s"
            self.ran = (began, time.time())
            out.seek(0)
            output = out.read()
        if code:
            return f"{self.name} failed ({code}):\n{output[-15000:]}"
        return ""


def inherited_env() -> dict[str, str]:
    return dict(os.environ)


_sessions: list[Session] = []


def spans(since: float) -> list[str]:
    """Each session that ran: when, in seconds since `since`."""
    return [f"{s.name}: {s.ran[0] - since:.0f}-{s.ran[1] - since:.0f} s" for s in _sessions if s.ran]


def stop_all() -> None:
    for session in _sessions:
        session.stop()


_runs: queue.Queue[Session] | None = None


def _queue() -> queue.Queue[Session]:
    """The sessions in the order they were started, run one at a time by one thread."""
    global _runs
    if _runs is None:
        _runs = queue.Queue()
        threading.Thread(target=_run_in_turn, args=(_runs,), name="beside-the-suite", daemon=True).start()
    return _runs


def _run_in_turn(runs: queue.Queue[Session]) -> None:
    while True:
        runs.get().run()
