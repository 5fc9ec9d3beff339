"""The typed clients read SSE as the spec writes it: events, usage chunks, error events, and a 200
that is not SSE. Every test runs the sync and the async client; no vLLM engine."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.errors import GenerateError
from tests.support.scripted_upstream import (
    DONE, KINDS, REQUEST, batch, chunk, data, error_json, run, sse_bytes, token_ids,
)


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
