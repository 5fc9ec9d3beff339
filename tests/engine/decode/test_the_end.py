"""The package's last module (pytest runs them in name order): its server's end, the real engine
core killed mid-stream. With --api-server-count 2: tests/engine/test_scale_out.py."""

from __future__ import annotations

import os
import signal
import time

import httpx
import psutil
import pytest

from tests.support.processes import engine_cores, wait_ended
from tests.support.stream_reader import StreamReader
from tests.support import post, scripted

pytestmark = [pytest.mark.real_engine, pytest.mark.reliability]

PROMPT = [9707, 1879]
LONG = {"max_tokens": 3000, "ignore_eos": True}

DEAD = "the engine is dead; this server will restart"


@pytest.mark.timeout(300, func_only=True)
def test_a_real_engine_core_killed_mid_stream(server):
    """Open streams end with a 503 error event, /health and new requests answer 503 for the grace
    period, then the process exits non-zero (so it is restarted). Every answer is checked in process,
    deterministically (the scripted engine's `die()`): tests/app/generate/test_admission.py. Here the core
    process is killed (SIGKILL) and vLLM notices at its own speed, so everything is checked in the
    order it must happen (the error event, then /health and a new request inside the grace the
    server lingers for, then the exit), not against the wall clock."""
    stream = StreamReader(server.url, scripted(PROMPT, [], sampling_params=LONG))
    stream.wait_events(3)
    children = psutil.Process(server.proc.pid).children(recursive=True)
    killed_at = time.monotonic()
    for p in engine_cores(server):
        os.kill(p.pid, signal.SIGKILL)
    stream.join(120)
    assert stream.done(), stream.payloads()[-3:]
    # Asked the moment the error event arrived: well inside the ENGINE_DEATH_GRACE_S (2 s) the
    # server stays up after its watchdog notices the death.
    error_at = stream.events[-2][0]
    health = httpx.get(server.url + "/health", timeout=10)
    new = post(server.url, {"token_ids": PROMPT})
    code = server.proc.wait(120)
    alive = wait_ended(children, 30)
    print(f"engine core killed → error event after {error_at - killed_at:.1f} s")
    *tokens, error, _ = stream.payloads()
    assert len(tokens) >= 3
    assert error == {"error": {"message": DEAD, "type": "ServiceUnavailableError", "param": None, "code": 503}}
    assert (health.status_code, health.json()["error"]["message"]) == (503, "the engine is dead")
    assert (new.status_code, new.json()["error"]["message"]) == (503, DEAD)
    assert code == 1, server.log_tail()
    assert not alive, f"outlived the server: {alive}"
