"""The engine's processes in a process group of their own, tied to the server's life.

A signal to the server's whole process group (Ctrl+C in a terminal, `kill -TERM -- -PGID`, an
init wrapper that signals the group) would otherwise reach vLLM's engine core too, which dies at
once under every open stream. Started inside `engine_session()`, each process the server starts
(the engine core; with --data-parallel-size, the coordinator; the resource tracker if it is first
needed there) first calls `detach()`:
- `os.setpgid(0, 0)`: its own process group, in the server's session, so only the server sees a
  signal to the server's group (a terminal's Ctrl+C goes to its foreground group only); the server
  drains, then stops the engine itself. Not a session of its own (`setsid`): with Linux's autogroup
  scheduling each session is a CPU scheduling group, and an engine in a group of its own takes
  half the CPU from the API process under contention, which then reads engine steps late and
  merges them (fewer, bigger stream events than vLLM's own server sends);
- `PR_SET_PDEATHSIG`: SIGTERM (vLLM's engine core shuts down on it) when the server dies, for
  vLLM's engine core does not watch its parent: a SIGKILL of the server leaves no engine behind.
  The engine's own workers (tensor parallel) watch the engine core through vLLM's death pipe.

With the spawn start method (vLLM's on CPU, and `vllm serve`'s default) multiprocessing's
executable is, for the scope, a two-line script that runs `exec_detached` before it execs Python
with multiprocessing's command line (vLLM's NUMA wrapper, when used, wraps this one). With fork,
a multiprocessing after-fork hook runs `detach` in the child before its target.

A cgroup-wide signal (systemd's KillMode=control-group) reaches every process whatever its
group: use KillMode=mixed (deploy/systemd does).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.spawn
import multiprocessing.util
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Iterator

log = logging.getLogger("decode_server.process.engine_session")

PR_SET_PDEATHSIG = 1
# What the engine gets when the server dies: vLLM's engine core shuts down (and stops its workers) on it.
PARENT_DEATH_SIGNAL = signal.SIGTERM


def detach(parent: int) -> None:
    """In a child of `parent`, before it runs anything else: its own process group (in the server's
    session: see above), and a signal when `parent` (the thread of it that started the child: the
    server's main thread) dies."""
    os.setpgid(0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # the server died before the signal was armed
        os._exit(1)


def exec_detached() -> None:
    """The spawn executable's body: argv = [parent pid, python, multiprocessing's arguments...]."""
    parent, *argv = sys.argv[1:]
    detach(int(parent))
    os.execv(argv[0], argv)


class _AfterFork:
    """The fork start method's hook (multiprocessing keeps it while this object lives)."""

    def __init__(self, parent: int):
        self.parent = parent

    def __call__(self) -> None:
        # Only the server's own children: a process they fork in turn inherits the hook.
        child_of = multiprocessing.parent_process()
        if child_of is not None and child_of.pid == self.parent:
            detach(self.parent)


_wrappers: dict[tuple[str, int], tempfile.TemporaryDirectory] = {}


def _wrapper(python: str, parent: int) -> str | None:
    """The spawn executable: a script that lives as long as the server (its shell reads it after
    the exec that starts the child returns). None where the temporary directory is mounted noexec."""
    directory = _wrappers.get((python, parent))
    if directory is None:
        directory = tempfile.TemporaryDirectory(prefix="decode-server-engine-")
        if os.statvfs(directory.name).f_flag & os.ST_NOEXEC:
            log.warning(
                "%s is mounted noexec: vLLM's engine processes stay in the server's process group "
                "(a signal to the whole group reaches them; set TMPDIR to an exec mount)", tempfile.gettempdir()
            )
            directory.cleanup()
            return None
        _wrappers[(python, parent)] = directory
        code = f"from {__name__} import exec_detached; exec_detached()"
        with open(os.path.join(directory.name, "python"), "w") as f:
            f.write(f'#!/bin/sh\nexec {shlex.quote(python)} -c {shlex.quote(code)} {parent} {shlex.quote(python)} "$@"\n')
        os.chmod(f.name, 0o700)
    return os.path.join(directory.name, "python")


@contextlib.contextmanager
def engine_session() -> Iterator[None]:
    """Every process multiprocessing starts in this scope, from this thread, detaches (see above).
    Enter it on the thread that lives as long as the server (its main thread)."""
    parent = os.getpid()
    previous = os.fsdecode(multiprocessing.spawn.get_executable())
    hook = _AfterFork(parent)
    multiprocessing.util.register_after_fork(hook, _AfterFork.__call__)
    multiprocessing.spawn.set_executable(_wrapper(previous, parent) or previous)
    try:
        yield
    finally:
        multiprocessing.spawn.set_executable(previous)
        del hook
