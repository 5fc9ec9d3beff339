"""The HTTP handlers, one module-level function per route; the work is in service.py and the pipeline.

Every failure is raised as (or turned into) an `errors.ServerError`, which the app's one
exception handler renders; `RequestRecord` does a generate request's bookkeeping once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from decode_server import __version__
from decode_server.config import ServerConfig
from decode_server.errors import ClientDisconnected, Rejected, ServerError, describe, draining, engine_dead
from decode_server.fingerprint import HEADER as FINGERPRINT_HEADER
from decode_server.metrics import Metrics
from decode_server.openapi import openapi_document
from decode_server.request_record import RequestRecord
from decode_server.service import GenerateService
from decode_server.sse import sse_response
from protocol.errors import error_body
from protocol.generate import AbortRequest, GenerateRequest, new_request_id

_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(GenerateRequest)
_abort_decoder = msgspec.json.Decoder(AbortRequest)


@dataclass
class AppState:
    """What the handlers share: set up by the app, the service filled in by the lifespan."""

    config: ServerConfig
    lifecycle: Any  # server.Lifecycle: draining, engine_died
    metrics: Metrics
    service: GenerateService | None = None
    started_at: int = 0

    def admit(self) -> None:
        if self.service.engine.is_dead:
            raise engine_dead()
        if self.lifecycle.draining:
            raise draining()


def _state(request: Request) -> AppState:
    return request.app.state.decode_server


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_encoder.encode(obj), status_code=status, media_type="application/json", headers=headers)


async def render_error(request: Request, e: Exception) -> Response:
    """The app's exception handler for every ServerError."""
    assert isinstance(e, ServerError)
    return json_response(error_body(e.status, e.message, e.param, e.error_type), e.status, e.headers)


# ------------------------------------------------------------------ reading requests


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Rejected(f"request body exceeds {limit} bytes", status=413, reason="too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise Rejected(f"request body exceeds {limit} bytes", status=413, reason="too_large")
    return bytes(body)


def decode_generate(body: bytes, header_request_id: str | None) -> GenerateRequest:
    try:
        req = _request_decoder.decode(body)
    except msgspec.ValidationError as e:
        raise Rejected(f"invalid request: {e}", reason="invalid_field") from e
    except msgspec.DecodeError as e:
        raise Rejected(f"request body is not valid JSON: {e}", reason="invalid_json") from e
    if req.request_id is msgspec.UNSET:
        req.request_id = header_request_id or new_request_id()
    return req


async def until_disconnect(request: Request, work: Any) -> Any:
    """Await `work`, cancelling it the moment the client goes away (event-driven, no polling)."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientDisconnected


async def _first_chunk(chunks: Any) -> Any:
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        return None


# ------------------------------------------------------------------ generate


def _failed(record: RequestRecord, e: Exception) -> ServerError:
    error = describe(e)
    record.finish(error.status, error.reason)
    return error


async def generate(request: Request) -> Response:
    st = _state(request)
    config = st.config
    record = RequestRecord(st.metrics, config.access_log and request.url.path not in config.access_log_skip_paths)
    try:
        st.admit()
        req = decode_generate(await read_body(request, st.config.max_request_bytes), request.headers.get("x-request-id"))
    except Exception as e:
        raise _failed(record, e) from e
    record.request_id, record.output_mode = req.request_id, req.output_mode
    try:
        return await _answer(request, st, record, req)
    except Exception as e:
        error = _failed(record, e)
        if error.status < 500:
            await st.service.release_remote_prefill(req)
        raise error from e


async def _answer(request: Request, st: AppState, record: RequestRecord, req: GenerateRequest) -> Response:
    service = st.service
    service.check_fingerprint(request.headers.get(FINGERPRINT_HEADER))
    generation = service.prepare(req)
    record.admitted(req.request_id, req.output_mode, generation)
    headers = {"x-request-id": req.request_id, FINGERPRINT_HEADER: service.fingerprint}
    if generation.stream:
        chunks = generation.chunks()
        # The first chunk is awaited before answering so a request the engine
        # refuses still gets a 4xx, not a 200 with an error event.
        first = await until_disconnect(request, _first_chunk(chunks))
        return sse_response(first, record.track(chunks), headers, st.config.sse_keep_alive_s)
    body = await until_disconnect(request, generation.response())
    record.finish(200)
    return json_response(body, headers=headers)


# ------------------------------------------------------------------ the other routes


async def abort_requests(request: Request) -> Response:
    st = _state(request)
    body = await read_body(request, st.config.max_request_bytes)
    try:
        ids = _abort_decoder.decode(body).request_ids
    except msgspec.ValidationError as e:
        raise Rejected(f"invalid abort request: {e}", param="request_ids") from e
    except msgspec.DecodeError as e:
        raise Rejected(f"request body is not valid JSON: {e}") from e
    aborted = await st.service.engine.abort(ids)
    if aborted:
        st.metrics.aborted("abort_endpoint", len(aborted))
    return Response(status_code=200)


async def health(request: Request) -> Response:
    if _state(request).service.engine.is_dead:
        raise Rejected("the engine is dead", status=503, reason="engine_dead")
    return Response(status_code=200)


async def ready(request: Request) -> Response:
    st = _state(request)
    if st.lifecycle.draining:
        raise Rejected("draining", status=503, reason="draining")
    if st.service.engine.is_dead:
        raise Rejected("the engine is dead", status=503, reason="engine_dead")
    return Response(status_code=200)


async def models(request: Request) -> Response:
    st = _state(request)
    engine = st.service.engine
    data = [
        {
            "id": name,
            "object": "model",
            "created": st.started_at,
            "owned_by": "decode-server",
            "root": engine.llm.model_config.model,
            "max_model_len": engine.limits.max_model_len,
            "parser_fingerprint": st.service.fingerprint,
        }
        for name in st.config.served_model_names
    ]
    return json_response({"object": "list", "data": data})


async def version(request: Request) -> Response:
    import vllm

    return json_response({"version": __version__, "vllm": vllm.__version__})


async def metrics(request: Request) -> Response:
    st = _state(request)
    body, content_type = st.metrics.render(st.service.engine)
    return Response(body, media_type=content_type)


async def load(request: Request) -> Response:
    if not _state(request).config.load_tracking:
        return json_response({"server_load": None})
    return json_response({"server_load": _state(request).metrics.server_load})


async def openapi(request: Request) -> Response:
    return json_response(openapi_document(__version__))


def started_now() -> int:
    return int(time.time())
