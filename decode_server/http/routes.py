"""The HTTP handlers, one module-level function per route; the work is in service.py and the pipeline.

Every failure is raised as (or turned into) an `errors.ServerError`, which the app's one
exception handler renders; `RequestRecord` does a generate request's bookkeeping once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from vllm.utils import random_uuid
from starlette.responses import Response
from vllm.entrypoints.generate.base.serving import GenerateBaseServing
from vllm.tracing.utils import contains_trace_headers, extract_trace_headers

from decode_server import __version__
from decode_server.config import ServerConfig
from decode_server.errors import ClientDisconnected, Rejected, ServerError, describe, draining, engine_dead
from decode_server.generate.fingerprint import HEADER as FINGERPRINT_HEADER
from decode_server.runtime.metrics import Metrics
from decode_server.http.openapi import openapi_document
from decode_server.runtime.request_record import RequestRecord
from decode_server.generate.service import GenerateService
from decode_server.http.sse import sse_response
from decode_server.generate.rules import (
    forbid_deep_json,
    forbid_invalid_cache_salt,
    forbid_invalid_raw_cache_salt,
    forbid_unreadable_request_id,
)
from protocol.errors import error_body
from protocol.decoding import MAX_IGNORED_FIELDS, decode_generate_request
from protocol.generate import AbortRequest, GenerateRequest

log = logging.getLogger("decode_server.http.routes")
_encoder = msgspec.json.Encoder()
_abort_decoder = msgspec.json.Decoder(AbortRequest)


@dataclass
class AppState:
    """What the handlers share: set up by the app, the service filled in by the lifespan."""

    config: ServerConfig
    lifecycle: Any  # server.Lifecycle: draining, engine_died
    metrics: Metrics
    service: GenerateService | None = None
    started_at: int = 0
    peers: Any = None  # peers.Peers with --api-server-count N > 1: the other API processes

    async def abort(self, ids: list[str]) -> int:
        """Abort by caller id; with peers, also what another API process holds. Returns the count."""
        if self.peers is None:
            return len(await self.service.engine.abort(ids))
        return await self.peers.abort(ids)

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


def decode_generate(body: bytes, header_request_id: str | None, metrics: Metrics) -> GenerateRequest:
    """Decode as vLLM's pydantic model would (lax types, unknown fields ignored), name the request."""
    forbid_deep_json(body)
    try:
        req, ignored = decode_generate_request(body)
    except msgspec.ValidationError as e:
        forbid_invalid_raw_cache_salt(body)  # vLLM checks it before the schema
        # "Bad Request" is the type vLLM's schema errors carry (FastAPI's validation handler).
        raise Rejected(f"invalid request: {e}", reason="invalid_field", error_type="Bad Request") from e
    except msgspec.DecodeError as e:
        raise Rejected(f"request body is not valid JSON: {e}", reason="invalid_json", error_type="Bad Request") from e
    for path in ignored:
        _note_ignored_field(path, metrics)
    # As vLLM: the X-Request-Id header names the request, else the body's request_id, else a new id.
    if header_request_id is not None:
        req.request_id = header_request_id
    elif req.request_id is msgspec.UNSET:
        req.request_id = random_uuid()
    forbid_unreadable_request_id(req.request_id)
    forbid_invalid_cache_salt(req.cache_salt)  # before the model check, as vLLM's before-validator
    return req


_ignored_seen: set[str] = set()


def _note_ignored_field(path: str, metrics: Metrics) -> None:
    """Visible, not fatal: a counter per field, and one log line the first time a field is seen."""
    metrics.unknown_fields.labels(path).inc()
    if path not in _ignored_seen and len(_ignored_seen) < MAX_IGNORED_FIELDS:
        _ignored_seen.add(path)
        log.warning("ignoring the unknown request field %r (the sender is newer than this server?)", path)


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
        body = await read_body(request, st.config.max_request_bytes)
        req = st.service.answered_as(decode_generate(body, request.headers.get("x-request-id"), st.metrics))
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


def _engine_headers(request: Request) -> dict[str, Any]:
    """What vLLM's generate reads from the headers for the engine: W3C trace context
    (`traceparent`, `tracestate`), `X-data-parallel-rank` and `X-Session-ID`, with vLLM's own readers."""
    headers = request.headers
    return {
        "trace_headers": extract_trace_headers(headers) if contains_trace_headers(headers) else None,
        "data_parallel_rank": GenerateBaseServing._get_data_parallel_rank(request),
        "session_id": GenerateBaseServing._get_session_id_from_headers(request),
    }


async def _answer(request: Request, st: AppState, record: RequestRecord, req: GenerateRequest) -> Response:
    service = st.service
    service.check_fingerprint(request.headers.get(FINGERPRINT_HEADER), req)
    generation = await service.prepare(req, **_engine_headers(request))
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
    aborted = await st.abort(ids)
    if aborted:
        st.metrics.aborted("abort_endpoint", aborted)
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
    # The LoRA adapters, as vLLM lists them (`root` the adapter path, `parent` the base model).
    adapters = await st.service.models.adapter_cards()
    data += [{**card, "created": st.started_at, "owned_by": "decode-server"} for card in adapters]
    return json_response({"object": "list", "data": data})


async def load_lora_adapter(request: Request) -> Response:
    """vLLM's `POST /v1/load_lora_adapter` (`lora_name`, `lora_path`); only with
    VLLM_ALLOW_RUNTIME_LORA_UPDATING, as vLLM."""
    st = _state(request)
    answer = await st.service.models.load(await read_body(request, st.config.max_request_bytes))
    return Response(answer, status_code=200)


async def unload_lora_adapter(request: Request) -> Response:
    st = _state(request)
    answer = await st.service.models.unload(await read_body(request, st.config.max_request_bytes))
    return Response(answer, status_code=200)


async def version(request: Request) -> Response:
    import vllm

    return json_response({"version": __version__, "vllm": vllm.__version__})


async def metrics(request: Request) -> Response:
    st = _state(request)
    if st.peers is not None:
        await st.peers.refresh_metrics()
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
