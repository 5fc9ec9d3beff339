"""What the typed clients send and keep: default and per-call headers, an error's status, headers
and body, httpx options, the retry policy's values. Sync and async client; no vLLM engine."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.clients.generate import AsyncClient, Client, Retry
from protocol.errors import GenerateError
from tests.support.scripted_upstream import (
    DONE, KINDS, REQUEST, batch, chunk, data, error_json, run, sse_bytes,
)


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
