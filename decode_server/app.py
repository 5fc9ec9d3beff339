"""The Starlette app, wiring only: routes, the lifespan that owns the engine, middleware, errors."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from decode_server import routes
from decode_server.auth import ApiKeyMiddleware
from decode_server.config import ServerConfig
from decode_server.engine import Engine
from decode_server.errors import ServerError
from decode_server.metrics import Metrics
from decode_server.service import GenerateService

ROUTES = [
    Route("/inference/v1/generate", routes.generate, methods=["POST"]),
    Route("/inference/v1/abort_requests", routes.abort_requests, methods=["POST"]),
    Route("/abort_requests", routes.abort_requests, methods=["POST"]),
    Route("/health", routes.health, methods=["GET"]),
    Route("/ready", routes.ready, methods=["GET"]),
    Route("/v1/models", routes.models, methods=["GET"]),
    Route("/version", routes.version, methods=["GET"]),
    Route("/metrics", routes.metrics, methods=["GET"]),
    Route("/openapi.json", routes.openapi, methods=["GET"]),
]


def build_app(engine_factory: Callable[[], Engine], config: ServerConfig, lifecycle: Any) -> Starlette:
    """`lifecycle` is the process's `server.Lifecycle` (drain state, engine watchdog)."""
    state = routes.AppState(config=config, lifecycle=lifecycle, metrics=Metrics())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        engine = engine_factory()
        engine.start_stats_logging()
        state.service = GenerateService(engine, config)
        state.started_at = routes.started_now()
        lifecycle.attach(engine, state.metrics)
        try:
            yield
        finally:
            lifecycle.detach()
            engine.shutdown()

    middleware = [Middleware(ApiKeyMiddleware, keys=config.api_keys)] if config.api_keys else []
    app = Starlette(
        routes=ROUTES, lifespan=lifespan, middleware=middleware, exception_handlers={ServerError: routes.render_error}
    )
    app.state.decode_server = state
    return app
