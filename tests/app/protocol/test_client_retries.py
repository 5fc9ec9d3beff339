"""The typed clients' retries: a 503 after its Retry-After, refused connections with backoff,
and never once a 200 answer has started. Sync and async client; no vLLM engine."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.clients.generate import Retry
from protocol.errors import GenerateError
from tests.support.scripted_upstream import (
    DONE, KINDS, REQUEST, batch, chunk, data, error_json, run, sse_bytes, token_ids,
)


# ---------------------------------------------------------------- retries


@pytest.mark.parametrize("method", ["generate", "stream"])
@pytest.mark.parametrize("kind", KINDS)
def test_503_is_retried_after_retry_after(srv, kind, method):
    async def answer(request: Request, attempt: int) -> Response:
        if attempt == 1:
            return JSONResponse(
                error_json(503, "the server is draining (shutting down); retry on another replica"),
                503,
                headers={"Retry-After": "1"},
            )
        if request.headers.get("accept") == "text/event-stream":
            return sse_bytes([data(chunk([7], finish="stop")), DONE])
        return JSONResponse(batch([7]))

    srv.script(answer)
    # backoff 0: a client that ignored Retry-After would come back at once and fail the wait check
    out = run(kind, srv.url, method, REQUEST, retry=Retry(attempts=3, backoff=0, jitter=0))
    got = token_ids(out) if method == "stream" else [out.choices[0].token_ids]
    assert got == [[7]]
    assert len(srv.calls) == 2
    waited = srv.calls[1]["t"] - srv.calls[0]["t"]
    assert 1.0 <= waited < 2.0, waited
    assert srv.calls[0]["body"] == srv.calls[1]["body"]


@pytest.mark.parametrize("kind", KINDS)
def test_503_retries_run_out_and_raise_the_last_answer(srv, kind):
    async def answer(request: Request, attempt: int) -> Response:
        return JSONResponse(error_json(503, f"draining (answer {attempt})"), 503, headers={"Retry-After": "0"})

    srv.script(answer)
    with pytest.raises(GenerateError) as e:
        run(kind, srv.url, "generate", REQUEST, retry=Retry(attempts=3, backoff=5))
    assert e.value.status == 503 and e.value.message == "draining (answer 3)"
    assert e.value.headers["retry-after"] == "0"
    assert len(srv.calls) == 3


@pytest.mark.parametrize("kind", KINDS)
def test_503_with_retry_after_beyond_the_cap_is_raised_at_once(srv, kind):
    async def answer(request: Request, attempt: int) -> Response:
        return JSONResponse(error_json(503, "draining"), 503, headers={"Retry-After": "3600"})

    srv.script(answer)
    t0 = time.monotonic()
    with pytest.raises(GenerateError) as e:
        run(kind, srv.url, "generate", REQUEST, retry=Retry(attempts=5, max_retry_after=30))
    assert e.value.status == 503 and e.value.message == "draining"
    assert len(srv.calls) == 1 and time.monotonic() - t0 < 1


@pytest.mark.parametrize("status", [500, 502, 400])
@pytest.mark.parametrize("kind", KINDS)
def test_other_statuses_are_not_retried_by_default(srv, kind, status):
    async def answer(request: Request, attempt: int) -> Response:
        return JSONResponse(error_json(status, "no retry for this"), status, headers={"Retry-After": "0"})

    srv.script(answer)
    with pytest.raises(GenerateError) as e:
        run(kind, srv.url, "generate", REQUEST)
    assert e.value.status == status and e.value.message == "no retry for this"
    assert len(srv.calls) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_no_retry_once_a_200_stream_started(srv, kind):
    async def answer(request: Request, attempt: int) -> Response:
        return sse_bytes([data(chunk([1])), data(chunk([2]))], fail_after=True)

    srv.script(answer)
    seen: list[Any] = []
    # even a policy that retries everything it may must not replay a started generate
    retry = Retry(attempts=5, backoff=0, statuses=frozenset({500, 502, 503, 504}))
    with pytest.raises(httpx.RemoteProtocolError) as e:
        run(kind, srv.url, "stream", REQUEST, seen=seen, retry=retry)
    assert "incomplete chunked read" in str(e.value) or "peer closed connection" in str(e.value)
    assert token_ids(seen) == [[1], [2]]
    assert len(srv.calls) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_no_retry_once_a_200_batch_body_started(srv, kind):
    async def answer(request: Request, attempt: int) -> Response:
        return sse_bytes([json.dumps(batch([1]))[:20].encode()], fail_after=True, media_type="application/json")

    srv.script(answer)
    retry = Retry(attempts=5, backoff=0, statuses=frozenset({500, 502, 503, 504}))
    with pytest.raises(httpx.RemoteProtocolError) as e:
        run(kind, srv.url, "generate", REQUEST, retry=retry)
    assert "incomplete chunked read" in str(e.value) or "peer closed connection" in str(e.value)
    assert len(srv.calls) == 1


class _Refusing:
    """Raises ConnectError (as a refused connection does) for the first `fails` tries, then
    sends for real; records when each try happened."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.tries: list[float] = []

    def refuse(self, request: httpx.Request) -> bool:
        self.tries.append(time.monotonic())
        return len(self.tries) <= self.fails


class RefusingTransport(httpx.HTTPTransport):
    def __init__(self, fails: int) -> None:
        super().__init__()
        self.log = _Refusing(fails)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.log.refuse(request):
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return super().handle_request(request)


class AsyncRefusingTransport(httpx.AsyncHTTPTransport):
    def __init__(self, fails: int) -> None:
        super().__init__()
        self.log = _Refusing(fails)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.log.refuse(request):
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return await super().handle_async_request(request)


@pytest.mark.parametrize("kind", KINDS)
def test_connect_errors_are_retried_with_backoff(srv, kind):
    async def answer(request: Request, attempt: int) -> Response:
        return JSONResponse(batch([3]))

    srv.script(answer)
    transport = RefusingTransport(2) if kind == "sync" else AsyncRefusingTransport(2)
    retry = Retry(attempts=3, backoff=0.1, multiplier=2, jitter=0)
    out = run(kind, srv.url, "generate", REQUEST, retry=retry, transport=transport)
    assert out.choices[0].token_ids == [3]
    tries = transport.log.tries
    assert len(tries) == 3 and len(srv.calls) == 1
    assert tries[1] - tries[0] >= 0.1 and tries[2] - tries[1] >= 0.2


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_port_raises_connect_error_after_the_attempts(kind):
    tries: list[float] = []

    def hook(request: httpx.Request) -> None:
        tries.append(time.monotonic())

    async def ahook(request: httpx.Request) -> None:
        tries.append(time.monotonic())

    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        hooks = {"request": [hook if kind == "sync" else ahook]}
        with pytest.raises(httpx.ConnectError) as e:
            run(kind, url, "generate", REQUEST, retry=Retry(attempts=3, backoff=0.05, jitter=0), event_hooks=hooks)
        assert "refused" in str(e.value).lower() or "connect" in str(e.value).lower()
        assert len(tries) == 3
        with pytest.raises(httpx.ConnectError):
            run(kind, url, "generate", REQUEST, retry=None, event_hooks=hooks)
        assert len(tries) == 4  # retry=None: one try
