"""`decode-server pd-proxy`: a tiny prefill/decode router for `POST /inference/v1/generate`.

For each request it runs the prefill leg on `--prefill` and the decode leg on `--decode`,
exactly as `protocol.pd` (and llm-d's NIXL v2 routing sidecar) does, and returns the decode
leg's answer as is: batch JSON, or the SSE stream passed through chunk by chunk. It loads no
model and imports no vLLM; it is for trying a P/D pair locally and for tests. In a cluster,
llm-d's routing sidecar plays this role.

- A prefill leg that fails answers with the prefill server's status and error body, and the
  header `x-pd-failed-leg: prefill`.
- Both legs get the caller's `X-Request-Id` (or the body's `request_id`, else a new id) and
  `Authorization` (unless `--api-key` sets the key to send upstream); the
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
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from protocol.errors import error_body
from protocol.generate import GenerateRequest
from protocol.pd import FINGERPRINT_HEADER, AsyncPDClient, PrefillLegError, request_id_of

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


def build_app(
    prefill_url: str,
    decode_url: str,
    *,
    api_key: str | None = None,
    timeout: float | None = 600.0,
    max_request_bytes: int = 8 * 1024 * 1024,
) -> Starlette:
    state: dict[str, AsyncPDClient] = {}

    def client() -> AsyncPDClient:
        if "pd" not in state:
            limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
            state["pd"] = AsyncPDClient(prefill_url, decode_url, api_key=api_key, timeout=timeout, limits=limits)
        return state["pd"]

    def forwarded_headers(request: Request) -> dict[str, str]:
        headers: dict[str, str] = {}
        if api_key is None and (auth := request.headers.get("authorization")):
            headers["authorization"] = auth
        if fp := request.headers.get(FINGERPRINT_HEADER):
            headers[FINGERPRINT_HEADER] = fp
        return headers

    async def generate(request: Request) -> Response:
        body = await request.body()
        if len(body) > max_request_bytes:
            return _error(413, f"request body exceeds {max_request_bytes} bytes")
        try:
            _validate.decode(body)  # fail before the prefill leg holds KV blocks for nothing
            data: dict[str, Any] = msgspec.json.decode(body)
        except msgspec.ValidationError as e:
            return _error(400, f"invalid request: {e}")
        except msgspec.DecodeError as e:
            return _error(400, f"request body is not valid JSON: {e}")
        rid = request_id_of(data, request.headers)
        headers = forwarded_headers(request)
        pd = client()
        try:
            kv = await pd.prefill(data, rid, headers=headers)
        except PrefillLegError as e:
            return _error(e.status, e.message, e.param, headers={"x-pd-failed-leg": "prefill", "x-request-id": rid})
        except httpx.HTTPError as e:
            return _error(502, f"prefill leg failed: {type(e).__name__}: {e}", headers={"x-pd-failed-leg": "prefill"})
        try:
            upstream = await pd.send_decode(data, kv, rid, headers=headers)
        except httpx.HTTPError as e:
            return _error(502, f"decode leg failed: {type(e).__name__}: {e}", headers={"x-pd-failed-leg": "decode"})
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

    async def health(request: Request) -> Response:
        bad = []
        async with httpx.AsyncClient(timeout=5) as http:
            for name, url in (("prefill", prefill_url), ("decode", decode_url)):
                try:
                    if (await http.get(url.rstrip("/") + "/health")).status_code != 200:
                        bad.append(name)
                except httpx.HTTPError:
                    bad.append(name)
        if bad:
            return _error(503, f"unhealthy upstream: {', '.join(bad)}")
        return Response(status_code=200)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if "pd" in state:
                await state.pop("pd").aclose()

    return Starlette(
        routes=[
            Route("/inference/v1/generate", generate, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
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
        help="Key sent upstream as 'Authorization: Bearer KEY' on both legs (default: "
        "$DECODE_SERVER_API_KEY; else the caller's Authorization header is forwarded).",
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
