"""pd-proxy's caller key: callers without it are refused, its key goes upstream, and without one
the caller's own Authorization is forwarded; its client keeps errors whole and parses SSE."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.testclient import TestClient

from decode_server.tools.pd_proxy import build_app as build_pd_proxy
from protocol.errors import GenerateError
from tests.support.scripted_upstream import (
    KINDS, REQUEST, Upstream, batch, chunk, data, error_json, sse_bytes, token_ids,
)


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
