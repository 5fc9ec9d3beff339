"""A request body that dribbles in has a time bound (`--request-body-timeout`): a 408 in the error
shape every refusal has, with its reason counted, nothing held by the server, the connection closed,
and other requests served meanwhile.

In process (the real app over the scripted engine, bodies sent through tests/support/asgi_stream.py chunk by
chunk, as slowly as the test likes), and once on a real socket (uvicorn, tests/support/loopback.py) where a
client sends a head and part of its body and then nothing.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time

import httpx
import pytest

from tests.support.inprocess import body_for, error_of, serve
from tests.support.loopback import loopback
from tests.support.servers import PARSER_FLAGS
from tests.support import GENERATE

pytestmark = pytest.mark.anyio

BOUND_S = 1.0
SOCKET_BOUND_S = 5.0
SCRIPT = [9707, 11, 1879, 0]
IM_END = 151645  # the scripted engine ends the script with the model's EOS


def _message(received: int, bound_s: float = BOUND_S) -> str:
    return f"request body not received within {bound_s:g} s (got {received} bytes)"


async def _dribble(first: bytes, then_wait_s: float):
    """A body whose first bytes come at once and whose rest never comes (within `then_wait_s`)."""
    yield first
    await asyncio.sleep(then_wait_s)
    yield b"}"


async def test_a_dribbled_body_gets_408_within_its_bound_while_others_are_served(demo_model):
    async with serve(demo_model, *PARSER_FLAGS, "--request-body-timeout", str(BOUND_S)) as s:
        start = time.monotonic()
        slow = asyncio.create_task(s.client.post(GENERATE, content=_dribble(b'{"token_ids": [9707', 60)))
        await asyncio.sleep(0.2)  # the slow request is in its handler, reading
        assert not slow.done()
        # Meanwhile: a whole generate request, and the probes.
        served = await s.client.post(GENERATE, json=body_for("text", SCRIPT))
        assert served.status_code == 200, served.text
        assert served.json()["choices"][0]["text"] == "Hello, world!"
        assert (await s.client.get("/ready")).status_code == 200
        assert not slow.done(), "the other request was served while the slow body was still being read"

        r = await slow
        elapsed = time.monotonic() - start
        assert BOUND_S <= elapsed < BOUND_S + 2, elapsed
        assert error_of(r) == (408, _message(len(b'{"token_ids": [9707')), None)
        assert r.json()["error"]["type"] == "RequestTimeout"
        assert r.headers["connection"] == "close", "the unread rest of the body must not be parsed as a next request"
        assert await s.metric("decode_server_rejections_total", reason="body_timeout") == 1
        assert await s.metric("decode_server_requests_total", output_mode="unknown", status="408") == 1
        # Nothing held: no request state, nothing in flight, no engine request.
        assert await s.metric("decode_server_requests_in_flight") == 0
        assert await s.metric("decode_server_live_request_states") == 0
        assert s.engine.live_request_count() == 0 and s.state.metrics.server_load == 0


async def test_a_slow_body_within_its_bound_is_served(demo_model):
    """The bound is on the whole body, not a gap: three parts 0.3 s apart (0.9 s) under a 1.5 s bound."""

    async def parts():
        import json

        whole = json.dumps(body_for("tokens", SCRIPT)).encode()
        third = len(whole) // 3
        for i, part in enumerate((whole[:third], whole[third : 2 * third], whole[2 * third :])):
            if i:
                await asyncio.sleep(0.3)
            yield part

    async with serve(demo_model, *PARSER_FLAGS, "--request-body-timeout", "1.5") as s:
        r = await s.client.post(GENERATE, content=parts())
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == [*SCRIPT, IM_END]
        assert await s.metric("decode_server_rejections_total", reason="body_timeout") == 0


async def test_the_abort_route_has_the_same_bound(demo_model):
    async with serve(demo_model, *PARSER_FLAGS, "--request-body-timeout", str(BOUND_S)) as s:
        r = await s.client.post("/abort_requests", content=_dribble(b'{"request_ids": [', 60))
        assert error_of(r) == (408, _message(len(b'{"request_ids": [')), None)


def test_on_a_socket_the_stalled_body_gets_408_and_the_connection_closes(demo_model):
    """uvicorn and our protocol class: a client sends its head and 10 of 100 body bytes, then
    nothing. It reads a 408 with the error JSON, then end-of-stream; a request on another
    connection meanwhile is answered."""
    # A longer bound than in process: the request on the other connection must be answered within
    # it, and on a loaded machine a real socket's round trip can take over a second.
    with loopback(demo_model, *PARSER_FLAGS, "--request-body-timeout", str(SOCKET_BOUND_S)) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=SOCKET_BOUND_S + 30) as sock:
            start = time.monotonic()
            sock.sendall(
                f"POST {GENERATE} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode()
                + b'{"token_id'
            )
            served = httpx.post(srv.url + GENERATE, json=body_for("tokens", SCRIPT), timeout=30)
            assert served.status_code == 200 and served.json()["choices"][0]["token_ids"] == [*SCRIPT, IM_END]
            # Nothing has come back on the stalled connection yet: the other was served while it waited.
            assert select.select([sock], [], [], 0)[0] == [], "served while the stalled body was pending"
            answer = b""
            while chunk := sock.recv(65536):  # until the server closes the connection
                answer += chunk
            elapsed = time.monotonic() - start
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"connection: close" in head.lower()
        assert httpx.Response(408, content=body).json()["error"] == {
            "message": _message(10, SOCKET_BOUND_S), "type": "RequestTimeout", "param": None, "code": 408,
        }
        assert SOCKET_BOUND_S <= elapsed < SOCKET_BOUND_S + 30, elapsed
        assert srv.metric("decode_server_rejections_total", reason="body_timeout") == 1
        assert srv.metric("decode_server_live_request_states") == 0
