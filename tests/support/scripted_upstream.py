"""A loopback HTTP server whose answers each client test scripts (raw SSE bytes, 503s with
Retry-After, a 200 cut mid-body, ...), the wire pieces those answers are built from, and `run`,
which calls the sync or the async typed client against it (tests/app/protocol/test_client_*.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from protocol.clients.generate import AsyncClient, Client

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
