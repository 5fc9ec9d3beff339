"""`decode-server pd-proxy`: a tiny prefill/decode router for `POST /inference/v1/generate`.

For each request it runs the prefill leg on `--prefill` and the decode leg on `--decode`,
exactly as `protocol.clients.pd` (and llm-d's NIXL v2 routing sidecar) does, and returns the decode
leg's answer as is: batch JSON, or the SSE stream passed through chunk by chunk. It loads no
model and imports no vLLM; it is for trying a P/D pair locally and for tests. In a cluster,
llm-d's routing sidecar plays this role.

- A prefill leg that fails answers with the prefill server's status and error body, and the
  header `x-pd-failed-leg: prefill`.
- `--api-key KEY` guards `POST /inference/v1/generate`: a caller without
  `Authorization: Bearer KEY` gets 401 with vLLM's error body (constant-time compare), and
  both legs are sent the same `Authorization: Bearer KEY`. Without `--api-key` nothing is
  checked here and the caller's `Authorization` is forwarded to both legs.
- Both legs get the caller's `X-Request-Id` (or the body's `request_id`, else a new id); the
  `x-parser-fingerprint` header goes to the decode leg only.
- Closing the client connection mid-stream closes the decode leg, which aborts it there.
- `GET /health` is 200 when both upstreams answer 200 on `/health`, else 503.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from decode_server.http.auth import ApiKeyMiddleware
from decode_server.config import DEFAULT_MAX_REQUEST_BYTES
from protocol.errors import error_body
from protocol.generate import REQUEST_ID_HEADER, GenerateRequest
from protocol.clients.pd import FINGERPRINT_HEADER, AsyncPDClient, PrefillLegError, request_id_of

_encoder = msgspec.json.Encoder()
_validate = msgspec.json.Decoder(GenerateRequest)
# Hop-by-hop and framing headers are not copied from the decode leg's answer.
_DROP_RESPONSE_HEADERS = {
    "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding", "date", "server",
}


def _error(status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> Response:
    return Response(
        _encoder.encode(error_body(status, message, param)), status_code=status, media_type="application/json", headers=headers
    )


class _Proxy:
    """The two legs of one request, and the upstream client they share."""

    def __init__(self, prefill_url: str, decode_url: str, api_key: str | None, timeout: float | None, max_request_bytes: int):
        self.prefill_url, self.decode_url = prefill_url, decode_url
        self.api_key, self.timeout, self.max_request_bytes = api_key, timeout, max_request_bytes
        self._pd: AsyncPDClient | None = None

    @property
    def pd(self) -> AsyncPDClient:
        if self._pd is None:
            limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
            self._pd = AsyncPDClient(self.prefill_url, self.decode_url, api_key=self.api_key, timeout=self.timeout, limits=limits)
        return self._pd

    async def close(self) -> None:
        if self._pd is not None:
            await self._pd.aclose()
            self._pd = None

    def forwarded_headers(self, request: Request) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.api_key is None and (auth := request.headers.get("authorization")):
            headers["authorization"] = auth
        if fp := request.headers.get(FINGERPRINT_HEADER):
            headers[FINGERPRINT_HEADER] = fp
        return headers

    def decode_body(self, body: bytes) -> dict[str, Any] | Response:
        if len(body) > self.max_request_bytes:
            return _error(413, f"request body exceeds {self.max_request_bytes} bytes")
        try:
            _validate.decode(body)  # fail before the prefill leg holds KV blocks for nothing
            return msgspec.json.decode(body)
        except msgspec.ValidationError as e:
            return _error(400, f"invalid request: {e}")
        except msgspec.DecodeError as e:
            return _error(400, f"request body is not valid JSON: {e}")

    async def generate(self, request: Request) -> Response:
        data = self.decode_body(await request.body())
        if isinstance(data, Response):
            return data
        rid = request_id_of(data, request.headers)
        headers = self.forwarded_headers(request)
        try:
            kv = await self.pd.prefill(data, rid, headers=headers)
        except PrefillLegError as e:
            return _error(e.status, e.message, e.param, headers={"x-pd-failed-leg": "prefill", REQUEST_ID_HEADER: rid})
        except httpx.HTTPError as e:
            return _error(502, f"prefill leg failed: {type(e).__name__}: {e}", headers={"x-pd-failed-leg": "prefill"})
        try:
            upstream = await self.pd.send_decode(data, kv, rid, headers=headers)
        except httpx.HTTPError as e:
            return _error(502, f"decode leg failed: {type(e).__name__}: {e}", headers={"x-pd-failed-leg": "decode"})
        return await _relay_decode_answer(upstream)

    async def health(self, request: Request) -> Response:
        bad = []
        async with httpx.AsyncClient(timeout=5) as http:
            for name, url in (("prefill", self.prefill_url), ("decode", self.decode_url)):
                try:
                    if (await http.get(url.rstrip("/") + "/health")).status_code != 200:
                        bad.append(name)
                except httpx.HTTPError:
                    bad.append(name)
        if bad:
            return _error(503, f"unhealthy upstream: {', '.join(bad)}")
        return Response(status_code=200)


async def _relay_decode_answer(upstream: httpx.Response) -> Response:
    """The decode leg's answer as is: batch JSON, or its SSE stream chunk by chunk."""
    out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE_HEADERS}
    if upstream.status_code != 200:
        out_headers["x-pd-failed-leg"] = "decode"
    media_type = upstream.headers.get("content-type")
    if not media_type or not media_type.startswith("text/event-stream"):
        try:
            content = await upstream.aread()
        finally:
            await upstream.aclose()
        return Response(content, status_code=upstream.status_code, headers=out_headers)

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for part in upstream.aiter_raw():
                yield part
        finally:
            # Also runs when the client goes away: closing the decode leg aborts it there.
            await upstream.aclose()

    return StreamingResponse(
        relay(), status_code=upstream.status_code, headers=out_headers, background=BackgroundTask(upstream.aclose)
    )


def build_app(
    prefill_url: str,
    decode_url: str,
    *,
    api_key: str | None = None,
    timeout: float | None = 600.0,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> Starlette:
    proxy = _Proxy(prefill_url, decode_url, api_key, timeout, max_request_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await proxy.close()

    guarded = [Route("/inference/v1/generate", proxy.generate, methods=["POST"])]
    # The caller's key is checked as the server checks it (the same middleware).
    middleware = (
        [Middleware(ApiKeyMiddleware, keys=(api_key,), paths=[route.path for route in guarded])] if api_key is not None else []
    )
    return Starlette(
        routes=[*guarded, Route("/health", proxy.health, methods=["GET"])],
        lifespan=lifespan,
        middleware=middleware,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decode-server pd-proxy",
        description="Route POST /inference/v1/generate through a prefill server and a decode server "
        "(vLLM NixlConnector), as llm-d's NIXL v2 routing sidecar does.",
    )
    parser.add_argument("--prefill", required=True, metavar="URL", help="Prefill server base URL (--tokens-only, kv_producer).")
    parser.add_argument("--decode", required=True, metavar="URL", help="Decode server base URL (kv_consumer).")
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind (default: %(default)s).")
    parser.add_argument("--port", type=int, default=8000, help="Port to bind (default: %(default)s).")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("DECODE_SERVER_API_KEY"),
        help="Require 'Authorization: Bearer KEY' from callers of /inference/v1/generate (401 "
        "otherwise) and send the same header upstream on both legs (default: "
        "$DECODE_SERVER_API_KEY; else nothing is checked and the caller's Authorization header is forwarded).",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="Per-leg timeout in seconds (default: %(default)s).")
    parser.add_argument("--log-level", default="info", help="uvicorn log level (default: %(default)s).")
    return parser


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    args = build_parser().parse_args(argv)
    app = build_app(args.prefill, args.decode, api_key=args.api_key, timeout=args.timeout)
    uvicorn.run(app, host=args.host, port=args.port, loop="uvloop", log_level=args.log_level.lower(), access_log=False)


if __name__ == "__main__":
    main(sys.argv[1:])
