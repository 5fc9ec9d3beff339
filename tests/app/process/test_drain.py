"""Graceful drain on SIGTERM, the decision (decode_server/process/server.py's lifecycle), in process
over the scripted engine with the loop's clock moved by the test, at the production window: what
runs keeps running, nothing is aborted a moment before the deadline, everything left is aborted at
it, sse-starlette is told to close after the flush.

The same signal through real processes: tests/engine/test_drain.py (a real process over the
scripted engine), the end of tests/engine/prod/test_operations.py's server (a real engine, the drain
ending when its streams do) and tests/engine/test_scale_out.py's last test (a real engine, the cut at
the deadline on two API processes). While it drains the server keeps listening: test_drain_listening.py.
"""

from __future__ import annotations

import asyncio

import pytest
from sse_starlette.sse import AppStatus

from decode_server.config import DEFAULT_SHUTDOWN_TIMEOUT_S, DRAIN_FLUSH_S
from tests.support.inprocess import body_for
from tests.support.loop_clock import clock  # noqa: F401  (the fixture)
from tests.support import finish_reason, joined_tokens

IM_END = 151645
SHORT = [9707] * 10
LONG = {"max_tokens": 4000, "ignore_eos": True}


@pytest.mark.anyio
async def test_what_runs_keeps_running_and_what_is_left_is_aborted_at_the_deadline(clock, inproc):
    window = inproc.lifecycle.shutdown_timeout_s
    assert window == DEFAULT_SHUTDOWN_TIMEOUT_S, "the production window (no --shutdown-timeout)"
    long_gate = inproc.core.hold("long", after_tokens=3)
    short_gate = inproc.core.hold("short", after_tokens=1)
    long = asyncio.create_task(inproc.events(body_for("tokens", [], request_id="long", sampling_params=LONG)))
    short = asyncio.create_task(inproc.events(body_for("text", SHORT, request_id="short")))
    await long_gate.reached()
    await short_gate.reached()
    assert await inproc.metric("decode_server_draining") == 0

    with clock.frozen():  # so that the deadline is scheduled exactly `window` after drain_at
        drain_at = clock.time()
        inproc.lifecycle.begin_drain()
        for _ in range(5):  # the loop runs the signal handler's callback, then the deadline task
            await asyncio.sleep(0)
    assert await inproc.metric("decode_server_draining") == 1
    short_gate.release()
    events = await asyncio.wait_for(short, 10)
    assert (finish_reason(events), joined_tokens(events), events[-1]) == ("stop", SHORT + [IM_END], "[DONE]")
    further = inproc.core.hold("long", after_tokens=6)
    long_gate.release()
    await further.reached()  # the long one still gets tokens while draining

    with clock.frozen():  # from here only the test moves time: a stalled machine cannot
        while not inproc.core.aborted:
            assert not long.done(), "nothing ends before the deadline"
            assert clock.time() - drain_at < window + 2, "no abort at the deadline"
            await clock.advance(0.25)
        aborted_after = clock.time() - drain_at
        events = await long
        assert not AppStatus.should_exit, "aborted streams get DRAIN_FLUSH_S to send their last chunk"
        while not AppStatus.should_exit:
            assert clock.time() - drain_at < aborted_after + DRAIN_FLUSH_S + 1, "sse-starlette never told to close"
            await clock.advance(0.25)
        flushed_after = clock.time() - drain_at - aborted_after
    # The clock moves in steps of 0.25 s: each bound is exact to a step.
    assert window <= aborted_after < window + 0.5, aborted_after
    assert DRAIN_FLUSH_S <= flushed_after < DRAIN_FLUSH_S + 0.5, flushed_after
    assert (finish_reason(events), len(joined_tokens(events)), events[-1]) == ("abort", 6, "[DONE]")
    assert await inproc.metric("decode_server_aborts_total", cause="drain") == 1
    assert inproc.engine.live_request_count() == 0 and inproc.core.running == []
