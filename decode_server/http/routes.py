"""The HTTP handlers, one module-level function per route; the work is in the service and the pipeline.

Every failure is raised as (or turned into) an `errors.ServerError`, which the app's one
exception handler renders; a generate request's `RequestRecord` does its bookkeeping once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from decode_server import __version__
from decode_server.config import ServerConfig
from decode_server.errors import (
    DRAINING, ENGINE_DEAD, ClientDisconnected, Rejected, ServerError, body_timeout, draining, engine_dead,
)
from decode_server.generate.service import GenerateService
from decode_server.http.openapi import openapi_document
from decode_server.http.sse import sse_response
from decode_server.runtime.engine import Engine
from decode_server.runtime.metrics import Metrics
from decode_server.runtime.tracing import RequestSpan
from decode_server.runtime.peers import Peers
from decode_server.runtime.request_record import RequestRecord
from protocol.errors import error_body
from protocol.generate import FINGERPRINT_HEADER, REQUEST_ID_HEADER, AbortRequest

_encoder = msgspec.json.Encoder()
_abort_decoder = msgspec.json.Decoder(AbortRequest)
# The probes' own words (a generate request is told what to do about it).
_PROBE_DEAD, _PROBE_DRAINING = "the engine is dead", "draining"


class Lifecycle(Protocol):
    """What the app reads and drives of the process's lifecycle (`process/server.py`)."""

    @property
    def draining(self) -> bool: ...

    def attach(self, engine: Engine, metrics: Metrics) -> None: ...

    def detach(self) -> None: ...


@dataclass
class AppState:
    """What the handlers share: set up by the app, the service filled in by the lifespan."""

    config: ServerConfig
    lifecycle: Lifecycle
    metrics: Metrics
    service: GenerateService | None = None
    started_at: int = 0
    peers: Peers | None = None  # with --api-server-count N > 1: the other API processes

    async def abort(self, ids: list[str]) -> int:
        """Abort by caller id; with peers, also what another API process holds. Returns the count."""
        if self.peers is None:
            return len(await self.service.engine.abort(ids))
        return await self.peers.abort(ids)

    def refuse_if_dead(self, message: str = ENGINE_DEAD) -> None:
        if self.service.engine.is_dead:
            raise engine_dead(message)

    def refuse_if_draining(self, message: str = DRAINING) -> None:
        if self.lifecycle.draining:
            raise draining(message)


def _state(request: Request) -> AppState:
    return request.app.state.decode_server


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_encoder.encode(obj), status_code=status, media_type="application/json", headers=headers)


async def render_error(request: Request, e: Exception) -> Response:
    """The app's exception handler for every ServerError."""
    assert isinstance(e, ServerError)
    return json_response(error_body(e.status, e.message, e.param, e.error_type), e.status, e.headers)


async def read_body(request: Request, config: ServerConfig) -> bytes:
    """The whole body, at most `max_request_bytes` (413) and within `request_body_timeout_s` of the
    first read (408, and the connection is closed: what is left of the body is never read)."""
    limit = config.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Rejected(f"request body exceeds {limit} bytes", status=413, reason="too_large")
    body = bytearray()
    timeout_s = config.request_body_timeout_s or None
    try:
        async with asyncio.timeout(timeout_s):
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    raise Rejected(f"request body exceeds {limit} bytes", status=413, reason="too_large")
    except TimeoutError:
        raise body_timeout(timeout_s, len(body)) from None
    return bytes(body)


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


# ------------------------------------------------------------------ generate


@dataclass(frozen=True, slots=True)
class _Head:
    body: Any  # the batch body, or a stream's first chunk
    headers: dict[str, str]
    stream: bool
    in_rest: bool = False  # the stream's first chunk is yet to come, as the first of the rest


async def generate(request: Request) -> Response:
    st = _state(request)
    answer = _answer(request, st)
    head = await anext(answer)
    if head.stream:
        config = st.config
        refused = functools.partial(render_error, request) if head.in_rest else None
        return sse_response(head.body, answer, head.headers, config.sse_keep_alive_s,
                            stall_limit_s=config.stream_send_timeout_s, refused=refused)
    await anext(answer, None)  # the batch request's record ends, with its 200
    return json_response(head.body, headers=head.headers)


async def _answer(request: Request, st: AppState) -> AsyncIterator[Any]:
    """One generate request, recorded once however it ends: its head, then a stream's other chunks.
    The head is awaited before answering, so a request the engine refuses still gets a 4xx, not a
    200 with an error event. A one-pass stream's response awaits it (the head is then the first
    chunk): that response is set up while the engine computes the first token, and a client that
    leaves before it cancels it there, the engine request's abort shielded (one_pass.py)."""
    config = st.config
    access_log = config.access_log and request.url.path not in config.access_log_skip_paths
    span = RequestSpan(request.headers, enabled=st.service.tracing)
    with RequestRecord(st.metrics, access_log, span) as record:
        st.refuse_if_dead()
        st.refuse_if_draining()
        body = await read_body(request, config)
        async with st.service.generation(body, request.headers, record) as generation:
            record.in_flight(generation.stats)
            headers = {REQUEST_ID_HEADER: generation.request_id, FINGERPRINT_HEADER: st.service.fingerprint}
            if generation.head_in_response:
                yield _Head(None, headers, stream=True, in_rest=True)
                head = await generation.head()
            else:
                head = await until_disconnect(request, generation.head())
        if generation.head_in_response:
            yield head
        else:
            yield _Head(head, headers, generation.stream)
        if not generation.stream:
            return
        # Blocks of events handed to the response, counted here and added once when the stream ends
        # (a counter's inc takes a lock: once per write was 2 % of a tokens stream's frontend CPU).
        writes = 1 if head is not None else 0
        record.chunk_sent()
        try:
            async for events in generation.rest():
                record.chunk_sent()
                writes += 1
                yield events
        finally:
            st.metrics.stream_writes.inc(writes)


# ------------------------------------------------------------------ the other routes


async def abort_requests(request: Request) -> Response:
    st = _state(request)
    body = await read_body(request, st.config)
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
    _state(request).refuse_if_dead(_PROBE_DEAD)
    return Response(status_code=200)


async def ready(request: Request) -> Response:
    st = _state(request)
    st.refuse_if_draining(_PROBE_DRAINING)
    st.refuse_if_dead(_PROBE_DEAD)
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
    answer = await st.service.models.load(await read_body(request, st.config))
    return Response(answer, status_code=200)


async def unload_lora_adapter(request: Request) -> Response:
    st = _state(request)
    answer = await st.service.models.unload(await read_body(request, st.config))
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
