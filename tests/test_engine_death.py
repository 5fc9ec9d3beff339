"""The engine dying under a running server: open streams end with a 503 error event, /health and
new requests answer 503 for the grace period, then the process exits non-zero (so it is restarted).

In process, the same with every detail of the answers: tests/test_admission_inprocess.py. Here:
- a real process over the scripted engine (tests/scripted_server.py), whose engine dies when the
  stream has 3 tokens: the watchdog, the grace and the exit code, with no engine to race;
- a real engine whose core process is killed (SIGKILL) mid-stream: vLLM notices it, at its own
  speed; everything is checked in the order it must happen, not against the wall clock.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import psutil

from decode_server.config import ENGINE_DEATH_GRACE_S
from tests import servers
from tests.processes import engine_cores
from tests.scripted_server import scripted_process
from tests.servers import Server
from tests.stream_reader import StreamReader
from tests.support import post, scripted

PROMPT = [9707, 1879]
LONG = {"max_tokens": 3000, "ignore_eos": True}
DEAD = "the engine is dead; this server will restart"


def _after_the_error_event(server: Server, stream: StreamReader) -> tuple[float, httpx.Response, httpx.Response]:
    """Once the stream's error event arrived: (its arrival time, GET /health, a new request); both
    asked at once, well inside the ENGINE_DEATH_GRACE_S the server stays up after noticing."""
    stream.join(120)
    assert stream.done(), stream.payloads()[-3:]
    error_at = stream.events[-2][0]
    health = httpx.get(server.url + "/health", timeout=10)
    new = post(server.url, {"token_ids": PROMPT})
    return error_at, health, new


def _assert_ended_with_the_dead_engine_error(stream: StreamReader) -> None:
    *tokens, error, done = stream.payloads()
    assert done == "[DONE]" and len(tokens) >= 3, stream.payloads()[-3:]
    assert error == {"error": {"message": DEAD, "type": "ServiceUnavailableError", "param": None, "code": 503}}


def test_a_real_process_whose_engine_dies_ends_its_streams_answers_503_then_exits_1(demo_model, log_dir):
    server = scripted_process("engine-death-scripted", demo_model, log_dir, die_at={"victim": 3}).start(timeout_s=120)
    try:
        stream = StreamReader(server.url, scripted(PROMPT, [], request_id="victim", sampling_params=LONG))
        error_at, health, new = _after_the_error_event(server, stream)
        code = server.proc.wait(60)
        exited_at = time.monotonic()
    finally:
        server.stop()
    _assert_ended_with_the_dead_engine_error(stream)
    assert (health.status_code, health.json()["error"]["message"]) == (503, "the engine is dead")
    assert (new.status_code, new.json()["error"]["message"]) == (503, DEAD)
    assert code == 1, server.log_tail()  # on its own: `wait` above would have timed out
    print(f"exited {exited_at - error_at:.1f} s after the error event (grace {ENGINE_DEATH_GRACE_S} s)")


def test_a_real_engine_core_killed_mid_stream(demo_model, log_dir):
    server = servers.ours("engine-death", demo_model, log_dir).start()
    try:
        stream = StreamReader(server.url, scripted(PROMPT, [], sampling_params=LONG))
        stream.wait_events(3)
        children = psutil.Process(server.proc.pid).children(recursive=True)
        cores = engine_cores(server)
        killed_at = time.monotonic()
        for p in cores:
            os.kill(p.pid, signal.SIGKILL)
        error_at, health, new = _after_the_error_event(server, stream)
        code = server.proc.wait(120)
        _, alive = psutil.wait_procs(children, timeout=30)
    finally:
        server.stop()
    print(f"engine core killed → error event after {error_at - killed_at:.1f} s")
    _assert_ended_with_the_dead_engine_error(stream)
    assert (health.status_code, health.json()["error"]["message"]) == (503, "the engine is dead")
    assert (new.status_code, new.json()["error"]["message"]) == (503, DEAD)
    assert code not in (0, None), server.log_tail()
    assert not alive, f"outlived the server: {alive}"
