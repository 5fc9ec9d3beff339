"""decode_server/process/engine_session.py without an engine: what a process multiprocessing starts
inside `engine_session()` is (its own process group in the server's session and scheduling group,
the parent-death signal armed), with both start methods, and that it dies with its parent. The real
engine under a group SIGTERM: the end of tests/engine/prod/test_operations.py's server; under a SIGKILL
of the server: tests/engine/test_parser_matrix_real.py; beside CPU hogs:
tests/engine/decode/test_streams_under_load.py."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from decode_server.process.engine_session import PARENT_DEATH_SIGNAL, engine_session
from tests.support.processes import wait_ended

PR_GET_PDEATHSIG = 2


def autogroup() -> str:
    """The CPU scheduling group Linux's autogroup put this process in (one per session). Where the
    kernel has autogroup off (kernel.sched_autogroup_enabled=0, as on CI's machines) the file is
    empty or absent: every process then reads the same, and the session assertion carries the fact."""
    try:
        with open("/proc/self/autogroup") as f:
            fields = f.read().split()
    except FileNotFoundError:
        fields = []
    return fields[0] if fields else "autogroup off"


def received(ours, theirs, child):
    """What the child sent; closing our copy of its end makes a child that died unsent an EOFError
    with its traceback in the captured stderr, not a read that waits for pytest's timeout."""
    theirs.close()
    try:
        return ours.recv()
    finally:
        child.join(30)


def report(conn) -> None:
    """A child's target: its session, process group, parent-death signal and scheduling group."""
    sig = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0)
    conn.send((os.getpid(), os.getsid(0), os.getpgid(0), sig.value, autogroup()))
    conn.close()


def sleep_forever() -> None:
    time.sleep(3600)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_child_started_in_the_scope_has_its_own_process_group_and_the_parent_death_signal(method):
    context = multiprocessing.get_context(method)
    ours, theirs = context.Pipe()
    with engine_session():
        child = context.Process(target=report, args=(theirs,))
        child.start()
    pid, sid, pgid, death_signal, group = received(ours, theirs, child)
    assert (child.exitcode, pid) == (0, child.pid)
    assert pgid == pid != os.getpgid(0), "a process group of its own"
    assert death_signal == PARENT_DEATH_SIGNAL
    # A session of its own would be a scheduling group of its own: under CPU contention the API
    # process would get half the CPU against the engine and merge its steps (issue 30).
    assert sid == os.getsid(0), "in the parent's session"
    assert group == autogroup(), "in the parent's CPU scheduling group"


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_child_started_after_the_scope_is_left_as_multiprocessing_starts_it(method):
    context = multiprocessing.get_context(method)
    with engine_session():
        pass
    ours, theirs = context.Pipe()
    child = context.Process(target=report, args=(theirs,))
    child.start()
    _, sid, pgid, death_signal, _ = received(ours, theirs, child)
    assert (sid, pgid, death_signal) == (os.getsid(0), os.getpgid(0), 0)


PARENT = """
import multiprocessing, sys, time
from decode_server.process.engine_session import engine_session
from tests.engine.test_engine_session import sleep_forever
context = multiprocessing.get_context(sys.argv[1])
with engine_session():
    child = context.Process(target=sleep_forever)
    child.start()
print(child.pid, flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_signal_to_the_parents_group_misses_the_child_and_a_sigkill_of_the_parent_ends_it(method):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, method], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 30
        while os.getpgid(child.pid) != child.pid:  # a spawned child detaches once its interpreter starts
            assert time.monotonic() < deadline, "the child never detached"
            time.sleep(0.05)
        os.killpg(parent.pid, signal.SIGSTOP)  # a group signal the parent survives, to see who else gets it
        time.sleep(0.2)
        assert psutil.Process(parent.pid).status() == psutil.STATUS_STOPPED, "the signal reached the group"
        assert child.status() != psutil.STATUS_STOPPED, "and not the child"
    except BaseException:
        parent.kill()
        raise
    finally:
        os.killpg(parent.pid, signal.SIGCONT)
    parent.kill()
    parent.wait(10)
    started = time.monotonic()
    alive = wait_ended([child], 10)
    assert not alive, f"the child outlived its parent: {child}"
    print(f"{method}: the child ended {time.monotonic() - started:.2f} s after its parent's SIGKILL")
