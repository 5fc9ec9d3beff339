"""The Starlette app, wiring only: routes, the lifespan that owns the engine, middleware, errors."""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from decode_server.http import routes
from decode_server.http.auth import ApiKeyMiddleware
from decode_server.http.sse import BODY_SEND
from decode_server.config import ServerConfig
from decode_server.runtime.engine import Engine
from decode_server.errors import ServerError
from decode_server.runtime.metrics import Metrics
from decode_server.runtime.peers import Peers
from decode_server.generate.service import GenerateService


def _routes(config: ServerConfig) -> tuple[list[Route], list[Route]]:
    """(the routes the API key guards, the open ones: probes, metrics, models, as vLLM leaves them)."""
    guarded = [
        Route("/inference/v1/generate", routes.generate, methods=["POST"]),
        Route("/inference/v1/abort_requests", routes.abort_requests, methods=["POST"]),
        Route("/abort_requests", routes.abort_requests, methods=["POST"]),
    ]
    if config.runtime_lora_updating:
        guarded.append(Route("/v1/load_lora_adapter", routes.load_lora_adapter, methods=["POST"]))
        guarded.append(Route("/v1/unload_lora_adapter", routes.unload_lora_adapter, methods=["POST"]))
    open_ = [
        Route("/health", routes.health, methods=["GET"]),
        Route("/ready", routes.ready, methods=["GET"]),
        Route("/load", routes.load, methods=["GET"]),
        Route("/v1/models", routes.models, methods=["GET"]),
        Route("/version", routes.version, methods=["GET"]),
        Route("/metrics", routes.metrics, methods=["GET"]),
    ]
    if config.openapi:
        open_.append(Route("/openapi.json", routes.openapi, methods=["GET"]))
    return guarded, open_


def _operator_middleware(path: str) -> Middleware:
    """--middleware: a class (ASGI middleware) or an `async def (request, call_next)`, as vLLM loads them."""
    module_path, name = path.rsplit(".", 1)
    imported = getattr(importlib.import_module(module_path), name)
    if inspect.isclass(imported):
        return Middleware(imported)
    if inspect.iscoroutinefunction(imported):
        return Middleware(BaseHTTPMiddleware, dispatch=imported)
    raise ValueError(f"Invalid middleware {path}. Must be a function or a class.")


def _middleware(config: ServerConfig, guarded: list[Route]) -> list[Middleware]:
    """Outermost first: the operator's, then auth, then CORS (as vLLM stacks them)."""
    cors = config.cors
    stack = [_operator_middleware(path) for path in reversed(config.middleware)]
    if config.api_keys:
        stack.append(Middleware(ApiKeyMiddleware, keys=config.api_keys, paths=[route.path for route in guarded]))
    stack.append(
        Middleware(
            CORSMiddleware,
            allow_origins=list(cors.allowed_origins),
            allow_credentials=cors.allow_credentials,
            allow_methods=list(cors.allowed_methods),
            allow_headers=list(cors.allowed_headers),
        )
    )
    return stack


class DecodeServerApp(Starlette):
    """Starlette, and a stream's events sent below its per-message wrappers (http/sse.py: BODY_SEND)
    unless an operator's middleware (--middleware) is in the stack and may read them."""

    def __init__(self, *, events_below_middleware: bool, **kwargs: Any):
        super().__init__(**kwargs)
        self._events_below_middleware = events_below_middleware

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._events_below_middleware and scope["type"] == "http":
            scope[BODY_SEND] = send
        await super().__call__(scope, receive, send)


def build_app(
    engine_factory: Callable[[], Engine], config: ServerConfig, lifecycle: routes.Lifecycle, peers: Peers | None = None
) -> Starlette:
    """`lifecycle` is the process's (drain state, engine watchdog); `peers`, with
    --api-server-count N > 1, this process's end of the channel to the others (aborts, metrics)."""
    metrics = Metrics(config.served_model_names[0], draining=lambda: lifecycle.draining)
    state = routes.AppState(config=config, lifecycle=lifecycle, metrics=metrics, peers=peers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        engine = engine_factory()
        engine.start_stats_logging()
        state.service = GenerateService(engine, config, state.metrics)
        try:
            await state.service.models.start()  # --lora-modules into the engine; one that fails fails the start
        except BaseException:
            engine.shutdown()
            raise
        state.started_at = routes.started_now()
        lifecycle.attach(engine, state.metrics)
        if peers is not None:
            peers.start(engine, state.metrics)
        try:
            yield
        finally:
            lifecycle.detach()
            if peers is not None:
                peers.close()
            engine.shutdown()

    guarded, open_ = _routes(config)
    app = DecodeServerApp(
        events_below_middleware=not config.middleware,
        routes=guarded + open_,
        lifespan=lifespan,
        middleware=_middleware(config, guarded),
        exception_handlers={ServerError: routes.render_error},
    )
    app.state.decode_server = state
    return app
