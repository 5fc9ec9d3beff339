"""The typed clients and pd-proxy's caller-key check, fast: no vLLM engine.

A small Starlette app runs in uvicorn on a loopback port in a thread; each test scripts its
answers (raw SSE bytes, 503s with Retry-After, a 200 cut mid-body, ...) and reads back what
the clients sent. Every client test runs the sync and the async client.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from decode_server.tools.pd_proxy import build_app as build_pd_proxy
from protocol.clients.generate import AsyncClient, Client, Retry
from protocol.errors import GenerateError

KINDS = ["sync", "async"]
SSE = "text/event-stream; charset=utf-8"


# ---------------------------------------------------------------- the in-process server


class Upstream:
    """A loopback HTTP server whose answers each test scripts through `handler`."""

    def __init__(self) -> None:
        self.handler: Callable[[Request, int], Awaitable[Response]] = self._not_scripted
        self.calls: list[dict[str, Any]] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        app = Starlette(
            routes=[
                Route("/inference/v1/generate", self._endpoint, methods=["POST"]),
                Route("/inference/v1/abort_requests", self._endpoint, methods=["POST"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )
        config = uvicorn.Config(app, log_level="warning", lifespan="off", loop="asyncio", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @staticmethod
    async def _not_scripted(request: Request, attempt: int) -> Response:
        return JSONResponse({"error": {"message": "not scripted", "type": "Error", "param": None, "code": 500}}, 500)

    async def _endpoint(self, request: Request) -> Response:
        body = await request.body()
        self.calls.append(
            {"t": time.monotonic(), "path": request.url.path, "headers": dict(request.headers), "body": json.loads(body)}
        )
        return await self.handler(request, len(self.calls))

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    def start(self) -> Upstream:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()

    def script(self, handler: Callable[[Request, int], Awaitable[Response]]) -> None:
        self.handler = handler
        self.calls = []


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream().start()
    yield server
    server.stop()


@pytest.fixture
def srv(upstream: Upstream) -> Iterator[Upstream]:
    upstream.script(Upstream._not_scripted)
    yield upstream
    upstream.script(Upstream._not_scripted)


# ---------------------------------------------------------------- wire helpers


def chunk(ids: list[int], finish: str | None = None, rid: str = "r1") -> dict[str, Any]:
    return {
        "request_id": rid,
        "usage": None,
        "output_mode": "tokens",
        "choices": [
            {"index": 0, "finish_reason": finish, "stop_reason": None, "token_ids": ids, "logprobs": None}
        ],
    }


def batch(ids: list[int], rid: str = "r1", **extra: Any) -> dict[str, Any]:
    return {
        "request_id": rid,
        "model": "m",
        "created": 1,
        "usage": {"prompt_tokens": 2, "total_tokens": 2 + len(ids), "completion_tokens": len(ids)},
        "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": None, "token_ids": ids, "logprobs": None}],
        **extra,
    }


def error_json(code: int, message: str, param: str | None = None, type_: str = "Error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def sse_bytes(pieces: list[bytes], *, split: int = 0, fail_after: bool = False, media_type: str = SSE) -> StreamingResponse:
    """A 200 streaming `pieces` (cut into `split`-byte writes when split > 0); with
    `fail_after`, the connection breaks after the last piece (no end of body)."""
    data = b"".join(pieces)
    parts = [data[i : i + split] for i in range(0, len(data), split)] if split else pieces

    async def gen() -> Any:
        for part in parts:
            yield part
            await asyncio.sleep(0)
        if fail_after:
            raise RuntimeError("the test server breaks the connection mid-body")

    return StreamingResponse(gen(), media_type=media_type)


def data(obj: Any, prefix: bytes = b"data: ") -> bytes:
    return prefix + json.dumps(obj).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
REQUEST = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 4}}


def run(kind: str, url: str, method: str, arg: Any, *, seen: list | None = None, call: dict | None = None, **client_kw: Any) -> Any:
    """Call `method` (generate / stream / abort) on a fresh sync or async client; a stream's chunks
    are appended to `seen` as they arrive (so a test sees them even when the stream then raises)."""
    seen = [] if seen is None else seen
    call = call or {}
    if kind == "sync":
        with Client(url, **client_kw) as c:
            if method == "stream":
                for ch in c.stream(arg, **call):
                    seen.append(ch)
                return seen
            return getattr(c, method)(arg, **call)

    async def main() -> Any:
        async with AsyncClient(url, **client_kw) as c:
            if method == "stream":
                async for ch in c.stream(arg, **call):
                    seen.append(ch)
                return seen
            return await getattr(c, method)(arg, **call)

    return asyncio.run(main())


def token_ids(chunks: list[Any]) -> list[list[int]]:
    return [c.choices[0].token_ids for c in chunks]


# ---------------------------------------------------------------- SSE parsing


@pytest.mark.parametrize("kind", KINDS)
def test_stream_parses_spec_sse_not_just_data_space_lines(srv, kind):
    one = json.dumps(chunk([11])).encode()
    body = [
        b": ping - 2026-01-01 00:00:00\n\n",  # sse-starlette's keep-alive comment
        b"data:" + json.dumps(chunk([10])).encode() + b"\n\n",  # no space after the colon
        b"data: " + one[: len(one) // 2] + b"\ndata: " + one[len(one) // 2 :] + b"\n\n",  # multi-line data
        b"event: message\r\nid: 7\r\nretry: 1000\r\n" + data(chunk([12])).replace(b"\n\n", b"\r\n\r\n"),  # CRLF
        b"event: progress\ndata: " + json.dumps({"note": "a named event, not a chunk"}).encode() + b"\n\n",
        b": just a comment\n",
        b"id: 8\n\n",  # an event with no data
        data(chunk([13], finish="stop")),
        DONE,
    ]

    async def answer(request: Request, attempt: int) -> Response:
        return sse_bytes(body, split=7)  # lines and events cut across writes

    srv.script(answer)
    chunks = run(kind, srv.url, "stream", REQUEST)
    assert token_ids(chunks) == [[10], [11], [12], [13]]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert srv.calls[0]["body"]["stream"] is True


@pytest.mark.parametrize("kind", KINDS)
def test_usage_chunk_is_typed(srv, kind):
    usage = {"request_id": "r1", "usage": {"prompt_tokens": 2, "total_tokens": 3, "completion_tokens": 1},
             "output_mode": "tokens", "choices": []}

    async def answer(request: Request, attempt: int) -> Response:
        return sse_bytes([data(chunk([5])), data(usage), DONE])

    srv.script(answer)
    chunks = run(kind, srv.url, "stream", REQUEST)
    assert type(chunks[1]).__name__ == "UsageChunk" and chunks[1].usage.total_tokens == 3


@pytest.mark.parametrize("named", [False, True], ids=["data-error-key", "event-error"])
@pytest.mark.parametrize("kind", KINDS)
def test_stream_error_event_raises_generate_error(srv, kind, named):
    err = error_json(503, "the engine is dead; this server will restart", type_="ServiceUnavailableError")
    event = (b"event: error\n" if named else b"") + data(err)

    async def answer(request: Request, attempt: int) -> Response:
        r = sse_bytes([data(chunk([1])), event, DONE])
        r.headers["x-request-id"] = "r1"
        return r

    srv.script(answer)
    seen: list[Any] = []
    with pytest.raises(GenerateError) as e:
        run(kind, srv.url, "stream", REQUEST, seen=seen)
    assert token_ids(seen) == [[1]]
    assert e.value.status == 503
    assert e.value.message == "the engine is dead; this server will restart"
    assert e.value.param is None
    assert json.loads(e.value.body) == err
    assert e.value.headers["x-request-id"] == "r1"
    assert len(srv.calls) == 1  # an error event inside a 200 is never retried


@pytest.mark.parametrize("kind", KINDS)
def test_a_200_that_is_not_sse_raises(srv, kind):
    async def answer(request: Request, attempt: int) -> Response:
        return JSONResponse(batch([1]))

    srv.script(answer)
    with pytest.raises(GenerateError) as e:
        run(kind, srv.url, "stream", REQUEST)
    assert e.value.status == 200
    assert "expected a text/event-stream answer" in e.value.message and "application/json" in e.value.message
    assert json.loads(e.value.body)["request_id"] == "r1"


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


# ---------------------------------------------------------------- headers, errors, options


@pytest.mark.parametrize("kind", KINDS)
def test_default_and_per_call_headers_are_sent(srv, kind):
    async def answer(request: Request, attempt: int) -> Response:
        if request.url.path.endswith("abort_requests"):
            return Response(status_code=200)
        if request.headers.get("accept") == "text/event-stream":
            return sse_bytes([data(chunk([1], finish="stop")), DONE])
        return JSONResponse(batch([1]))

    srv.script(answer)
    client_kw = {"api_key": "k1", "headers": {"X-Parser-Fingerprint": "fp-default", "X-Team": "a"}}
    call = {"headers": {"X-Request-Id": "rid-1", "X-Team": "b"}}
    run(kind, srv.url, "generate", REQUEST, call=call, **client_kw)
    run(kind, srv.url, "stream", REQUEST, call=call, **client_kw)
    run(kind, srv.url, "abort", ["rid-1"], call=call, **client_kw)
    run(kind, srv.url, "generate", REQUEST, **client_kw)
    assert [c["path"] for c in srv.calls] == ["/inference/v1/generate"] * 2 + ["/inference/v1/abort_requests"] + [
        "/inference/v1/generate"
    ]
    for c in srv.calls[:3]:
        h = c["headers"]
        assert h["authorization"] == "Bearer k1"
        assert h["x-parser-fingerprint"] == "fp-default"
        assert h["x-request-id"] == "rid-1"
        assert h["x-team"] == "b"  # a per-call header overrides the client's
        assert h["content-type"] == "application/json"
    assert srv.calls[1]["headers"]["accept"] == "text/event-stream"
    assert srv.calls[2]["body"] == {"request_ids": ["rid-1"]}
    last = srv.calls[3]["headers"]
    assert last["x-team"] == "a" and "x-request-id" not in last


@pytest.mark.parametrize("kind", KINDS)
def test_error_keeps_status_headers_and_body(srv, kind):
    raw = json.dumps(error_json(409, "parser fingerprint mismatch: sent 'fp-a', this server has 'fp-b'", "x-parser-fingerprint",
                                "ConflictError")).encode()

    async def answer(request: Request, attempt: int) -> Response:
        return Response(raw, 409, media_type="application/json", headers={"x-parser-fingerprint": "fp-b"})

    srv.script(answer)
    with pytest.raises(GenerateError) as e:
        run(kind, srv.url, "generate", REQUEST, call={"headers": {"X-Parser-Fingerprint": "fp-a"}})
    err = e.value
    assert err.status == 409
    assert err.message == "parser fingerprint mismatch: sent 'fp-a', this server has 'fp-b'"
    assert err.param == "x-parser-fingerprint"
    assert err.headers["X-Parser-Fingerprint"] == "fp-b"  # case-insensitive
    assert err.body == raw
    assert str(err) == f"409: {err.message}"


@pytest.mark.parametrize("kind", KINDS)
def test_a_non_json_error_body_is_kept_whole(srv, kind):
    raw = b"<html>502 Bad Gateway</html>" + b" " * 600 + b"end"

    async def answer(request: Request, attempt: int) -> Response:
        return Response(raw, 502, media_type="text/html")

    srv.script(answer)
    with pytest.raises(GenerateError) as e:
        run(kind, srv.url, "abort", ["x"])
    assert e.value.status == 502 and e.value.message.startswith("<html>502 Bad Gateway</html>")
    assert len(e.value.message) == 500 and e.value.body == raw
    assert e.value.headers["content-type"].startswith("text/html")


def test_httpx_options_pass_through():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=batch([4]))

    limits = httpx.Limits(max_connections=3)
    with Client("http://mock", transport=httpx.MockTransport(handler), limits=limits, verify=False, timeout=5) as c:
        assert c.generate(REQUEST).choices[0].token_ids == [4]
        assert c.http.timeout == httpx.Timeout(5)
    assert seen[0].url == "http://mock/inference/v1/generate"

    async def main() -> None:
        async def ahandler(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(200, json=batch([5]))

        async with AsyncClient("http://mock", transport=httpx.MockTransport(ahandler), follow_redirects=True) as c:
            assert (await c.generate(REQUEST)).choices[0].token_ids == [5]
            assert c.http.follow_redirects is True

    asyncio.run(main())
    assert len(seen) == 2


def test_retry_policy_values():
    r = Retry(attempts=4, backoff=0.5, multiplier=3, max_backoff=2, jitter=0)
    assert [r.backoff_for(n) for n in (1, 2, 3)] == [0.5, 1.5, 2]
    assert r.wait_after_status(1, 503, {"retry-after": "2"}) == 2.0
    assert r.wait_after_status(1, 503, {}) == 0.5
    assert r.wait_after_status(4, 503, {"retry-after": "2"}) is None  # attempts spent
    assert r.wait_after_status(1, 502, {"retry-after": "2"}) is None
    date = httpx.Headers({"retry-after": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 5))})
    assert 3 <= r.wait_after_status(1, 503, date) <= 5
    assert r.wait_after_error(1, httpx.ConnectError("x")) == 0.5
    assert r.wait_after_error(1, httpx.ReadTimeout("x")) is None  # the request may have started
    assert Retry(connect_errors=False).wait_after_error(1, httpx.ConnectError("x")) is None
    with pytest.raises(ValueError, match="attempts"):
        Retry(attempts=0)


# ---------------------------------------------------------------- pd-proxy's caller key


def _fake_pd_legs(srv: Upstream) -> None:
    async def answer(request: Request, attempt: int) -> Response:
        body = json.loads(await request.body())
        if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
            return JSONResponse(batch([9], kv_transfer_params={"remote_engine_id": "e1", "remote_block_ids": [1]}))
        return JSONResponse(batch([9, 10]))

    srv.script(answer)


UNAUTHORIZED = "missing or wrong API key (send 'Authorization: Bearer <key>')"


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "K"}, {"Authorization": "Bearer K "}],
    ids=["none", "wrong", "no-bearer", "trailing-space"],
)
def test_pd_proxy_rejects_callers_without_its_key(srv, headers):
    _fake_pd_legs(srv)
    with TestClient(build_pd_proxy(srv.url, srv.url, api_key="K")) as proxy:
        r = proxy.post("/inference/v1/generate", json=REQUEST, headers=headers)
        assert r.status_code == 401 and r.reason_phrase == "Unauthorized"
        assert r.json() == {"error": {"message": UNAUTHORIZED, "type": "Unauthorized", "param": None, "code": 401}}
        health = proxy.get("/health")  # probes stay open
        assert health.status_code == 200 and health.reason_phrase == "OK" and health.content == b""
    assert srv.calls == []  # neither leg ran


def test_pd_proxy_accepts_its_key_and_sends_it_upstream(srv):
    _fake_pd_legs(srv)
    with TestClient(build_pd_proxy(srv.url, srv.url, api_key="K")) as proxy:
        r = proxy.post("/inference/v1/generate", json=REQUEST, headers={"Authorization": "Bearer K", "X-Request-Id": "pd-1"})
        assert r.status_code == 200 and r.reason_phrase == "OK", r.text
        assert r.json()["choices"][0]["token_ids"] == [9, 10]
    prefill, decode = srv.calls
    assert prefill["body"]["kv_transfer_params"]["do_remote_decode"] is True
    assert decode["body"]["kv_transfer_params"] == {"remote_engine_id": "e1", "remote_block_ids": [1]}
    for leg in (prefill, decode):
        assert leg["headers"]["authorization"] == "Bearer K"
        assert leg["headers"]["x-request-id"] == "pd-1"


def test_pd_proxy_without_a_key_forwards_the_callers_authorization(srv):
    _fake_pd_legs(srv)
    with TestClient(build_pd_proxy(srv.url, srv.url)) as proxy:
        r = proxy.post("/inference/v1/generate", json=REQUEST, headers={"Authorization": "Bearer caller"})
        assert r.status_code == 200 and r.reason_phrase == "OK", r.text
        assert r.json()["choices"][0]["token_ids"] == [9, 10]
        r = proxy.post("/inference/v1/generate", json=REQUEST)
        assert r.status_code == 200 and r.reason_phrase == "OK", r.text
        assert r.json()["choices"][0]["token_ids"] == [9, 10]
    assert [c["headers"].get("authorization") for c in srv.calls] == ["Bearer caller", "Bearer caller", None, None]


def test_pd_client_errors_keep_headers_and_body(srv):
    from protocol.clients.pd import PDClient, PrefillLegError

    raw = json.dumps(error_json(400, "stop strings need a tokenizer", "sampling_params.stop", "BadRequestError")).encode()

    async def answer(request: Request, attempt: int) -> Response:
        return Response(raw, 400, media_type="application/json", headers={"x-request-id": "pd-2"})

    srv.script(answer)
    with PDClient(srv.url, srv.url) as pd, pytest.raises(PrefillLegError) as e:
        pd.generate({**REQUEST, "request_id": "pd-2"})
    assert e.value.status == 400 and e.value.message == "prefill leg failed: stop strings need a tokenizer"
    assert e.value.param == "sampling_params.stop"
    assert e.value.headers["x-request-id"] == "pd-2" and e.value.body == raw


@pytest.mark.parametrize("kind", KINDS)
def test_pd_client_stream_parses_sse(srv, kind):
    from protocol.clients.pd import AsyncPDClient, PDClient

    async def answer(request: Request, attempt: int) -> Response:
        body = json.loads(await request.body())
        if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
            return JSONResponse(batch([9], kv_transfer_params={"remote_engine_id": "e1"}))
        return sse_bytes([b"data:" + json.dumps(chunk([9])).encode() + b"\n\n", b": ping\n\n",
                          data(error_json(500, "engine failed"))], split=5)

    srv.script(answer)
    seen: list[Any] = []
    with pytest.raises(GenerateError) as e:
        if kind == "sync":
            with PDClient(srv.url, srv.url) as pd:
                for ch in pd.stream(REQUEST):
                    seen.append(ch)
        else:
            async def main() -> None:
                async with AsyncPDClient(srv.url, srv.url) as pd:
                    async for ch in pd.stream(REQUEST):
                        seen.append(ch)

            asyncio.run(main())
    assert token_ids(seen) == [[9]]
    assert e.value.status == 500 and e.value.message == "engine failed"
