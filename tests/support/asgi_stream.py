"""An httpx transport to an ASGI app that streams, as a socket would.

httpx's own `ASGITransport` runs the app to its end before it returns the response: a stream arrives
in one piece, and the app sees `http.disconnect` only after it has finished. Here the response is
returned at `http.response.start`, its body chunks arrive as the app sends them, and closing the
response before its end is a client disconnect: `receive()` answers `http.disconnect` (as uvicorn
does) and later body sends are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

# How long a closed response waits for the app to finish before cancelling it.
APP_EXIT_TIMEOUT_S = 10.0


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: asyncio.Queue, app_task: asyncio.Task, disconnected: asyncio.Event):
        self._chunks, self._app_task, self._disconnected = chunks, app_task, disconnected

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self._chunks.get()) is not None:
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk

    async def aclose(self) -> None:
        self._disconnected.set()  # a no-op for an app that already finished
        try:
            await asyncio.wait_for(asyncio.shield(self._app_task), APP_EXIT_TIMEOUT_S)
        except asyncio.TimeoutError:
            self._app_task.cancel()
        except BaseException:
            pass  # the app's error already reached the reader, or the app was cancelled


class StreamingASGITransport(httpx.AsyncBaseTransport):
    def __init__(self, app: Any, client: tuple[str, int] = ("127.0.0.1", 123)):
        self.app = app
        self.client = client

    def _scope(self, request: httpx.Request) -> dict[str, Any]:
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port),
            "client": self.client,
            "root_path": "",
        }

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = request.stream.__aiter__()
        body_done = False
        disconnected = asyncio.Event()
        started: asyncio.Future = asyncio.get_running_loop().create_future()
        chunks: asyncio.Queue = asyncio.Queue()

        async def receive() -> dict[str, Any]:
            nonlocal body_done
            if not body_done:
                try:
                    return {"type": "http.request", "body": await body.__anext__(), "more_body": True}
                except StopAsyncIteration:
                    body_done = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                started.set_result(message)
            elif message["type"] == "http.response.body" and not disconnected.is_set():
                if message.get("body"):
                    chunks.put_nowait(message["body"])
                if not message.get("more_body", False):
                    chunks.put_nowait(None)

        async def run() -> None:
            try:
                await self.app(self._scope(request), receive, send)
            except BaseException as e:
                if not started.done():
                    started.set_exception(e)
                chunks.put_nowait(e)
                raise
            finally:
                if not started.done():
                    started.set_exception(RuntimeError("the app ended without starting a response"))
                chunks.put_nowait(None)

        task = asyncio.create_task(run())
        try:
            message = await started
        except BaseException:  # the app failed before answering, or the caller gave up (cancelled)
            disconnected.set()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, APP_EXIT_TIMEOUT_S)
            raise
        return httpx.Response(message["status"], headers=message.get("headers", []), stream=_Body(chunks, task, disconnected))
