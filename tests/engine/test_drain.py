"""Graceful drain on SIGTERM through a real process: open streams finish inside the window, what is
left at the deadline ends with an abort chunk, the process exits 0.

Each tier proves what only it can:
- in process (the scripted engine, the loop's clock moved by the test): the decision, at the
  production window: tests/app/process/test_drain.py;
- a real process over the scripted engine (tests/support/scripted_server.py, no engine process),
  here: SIGTERM through uvicorn into the drain, exit code 0; gates decide which stream is in flight
  and which cannot finish, so no timing is guessed;
- a real engine: the same signal, to the whole process group, with vLLM's engine core behind it,
  as the end of tests/engine/prod/test_operations.py's server (one engine start less); its window is long
  enough for every stream on a loaded 2-core machine, so there the drain ends when the streams
  do; the cut at the deadline on a real engine: tests/engine/test_scale_out.py (two API processes).
"""

from __future__ import annotations

import pytest

from decode_server.config import DRAIN_FLUSH_S
from tests.support.processes import sigterm_and_wait
from tests.support.scripted_server import scripted_process
from tests.support.stream_reader import StreamReader
from tests.support import finish_reason, joined_tokens, scripted

IM_END = 151645
SHORT = [9707] * 10
LONG = {"max_tokens": 4000, "ignore_eos": True}


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
