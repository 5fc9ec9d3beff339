"""Graceful drain on SIGTERM: open streams finish inside the window, what is left at the deadline
ends with an abort chunk, the process exits 0.

Three tiers, each proving what only it can:
- in process (the scripted engine, the loop's clock moved by the test): the decision, at the
  production window: what runs keeps running, nothing is aborted a moment before the deadline,
  everything left is aborted at it, sse-starlette is told to close after the flush;
- a real process over the scripted engine (tests/support/scripted_server.py, no engine process): SIGTERM
  through uvicorn into the drain, exit code 0; gates decide which stream is in flight and which
  cannot finish, so no timing is guessed;
- a real engine: the same signal, to the whole process group, with vLLM's engine core behind it,
  as the end of tests/engine/prod/test_operations.py's server (one engine start less); its window is long
  enough for every stream on a loaded 2-core machine, so there the drain ends when the streams
  do; the cut at the deadline on a real engine: tests/engine/test_api_server_count.py (two API processes).
"""

from __future__ import annotations

import asyncio

import pytest
from sse_starlette.sse import AppStatus

from decode_server.config import DEFAULT_SHUTDOWN_TIMEOUT_S, DRAIN_FLUSH_S
from tests.support.inprocess import body_for
from tests.support.loop_clock import clock  # noqa: F401  (the fixture)
from tests.support.processes import sigterm_and_wait
from tests.support.scripted_server import scripted_process
from tests.support.stream_reader import StreamReader
from tests.support import finish_reason, joined_tokens, scripted

IM_END = 151645
SHORT = [9707] * 10
LONG = {"max_tokens": 4000, "ignore_eos": True}


# ------------------------------------------------------------------ in process: the decision


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


# ------------------------------------------------------------------ real processes


def test_sigterm_on_a_real_process_drains_then_exits_zero(demo_model, log_dir):
    """Scripted engine: "short" is held at 1 token until the drain begins, "long" at 3 for good."""
    window = 2
    server = scripted_process(
        "drain-scripted", demo_model, log_dir, "--shutdown-timeout", str(window),
        hold={"long": 3}, hold_until_drain={"short": 1},
    ).start(timeout_s=120)
    try:
        long = StreamReader(server.url, scripted([9707], [], request_id="long", sampling_params=LONG))
        short = StreamReader(server.url, scripted([9707], SHORT, request_id="short"))
        long.wait_events(3)
        short.wait_events(1)
        code, elapsed, alive = sigterm_and_wait(server, [long, short])
    finally:
        server.stop()
    assert (finish_reason(short.payloads()), joined_tokens(short.payloads())) == ("stop", SHORT + [IM_END])
    assert (finish_reason(long.payloads()), len(joined_tokens(long.payloads()))) == ("abort", 3)
    assert long.payloads()[-1] == short.payloads()[-1] == "[DONE]"
    assert code == 0, server.log_tail()
    assert window <= elapsed < window + DRAIN_FLUSH_S + 15, elapsed
    assert not alive
