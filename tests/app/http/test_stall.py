"""A stream whose client reads nothing is cut after the send timeout, in process: the ASGI `send`
never returns once the "socket buffers" are full, and the loop's clock is moved by the test, so the
cut is checked at the production limit, to the second, on any machine.

The real-socket check (kernel buffers filling on loopback, memory staying flat) is
test_faults_transport.py's stalled reader.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from tests.support.inprocess import body_for
from tests.support.loop_clock import clock  # noqa: F401  (the fixture)
from tests.support import GENERATE

pytestmark = pytest.mark.anyio

LONG = {"max_tokens": 4000, "ignore_eos": True}
BUFFERED_CHUNKS = 3  # body messages the "socket" takes before it is full


def _scope(raw: bytes) -> dict:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "path": GENERATE, "raw_path": GENERATE.encode(), "query_string": b"", "headers": headers,
        "scheme": "http", "server": ("decode-server.test", 80), "client": ("127.0.0.1", 123), "root_path": "",
    }


async def test_a_client_that_reads_nothing_is_cut_between_the_limit_and_a_quarter_more(clock, inproc, caplog):
    limit = inproc.state.config.stream_send_timeout_s
    assert limit == 60, "the production limit (DECODE_SERVER_STREAM_SEND_TIMEOUT_S unset)"
    raw = json.dumps({**body_for("text", [], request_id="stalled", sampling_params=LONG), "stream": True}).encode()
    bodies: list[bytes] = []
    full = asyncio.Event()
    requests = [{"type": "http.request", "body": raw, "more_body": False}]

    async def receive() -> dict:
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # the client is there (no disconnect), it just reads nothing
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body":
            if len(bodies) == BUFFERED_CHUNKS:
                full.set()
                await asyncio.Event().wait()  # every buffer is full: this send never completes
            bodies.append(message.get("body", b""))

    caplog.set_level(logging.WARNING, "decode_server.http.sse")
    app = asyncio.create_task(inproc.app(_scope(raw), receive, send))
    await asyncio.wait_for(full.wait(), 10)
    with clock.frozen():  # only the test moves time now: each look of the watch is one of its steps
        stalled_at = clock.time()
        while not app.done():
            assert clock.time() - stalled_at < 2 * limit, "never cut"
            await clock.advance(1.0)
        cut_after = clock.time() - stalled_at
    await app  # the cut ends the response; the app returns normally
    assert limit <= cut_after <= 1.25 * limit + 1, cut_after
    assert len(bodies) == BUFFERED_CHUNKS and not any(b"[DONE]" in b for b in bodies)
    assert f"stream cut: its client read nothing for {limit:.0f} s" in caplog.text
    assert len(inproc.core.aborted) == 1 and inproc.core.running == [], "its engine request is aborted"
    assert inproc.engine.live_request_count() == 0
    assert await inproc.metric("decode_server_requests_total", output_mode="text", status="499") == 1
    assert await inproc.metric("decode_server_aborts_total", cause="client_disconnect") == 1
    assert await inproc.metric("decode_server_requests_in_flight") == 0
    # The server is fine afterwards.
    events = await inproc.events(body_for("text", [9707, 11]))
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and events[-1] == "[DONE]"
