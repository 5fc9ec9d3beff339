"""Every error a request can end with, and its status: raised from any layer, mapped once.

`ServerError` carries the status, the message the client reads, the parameter at fault and
a short metrics label. `describe()` turns anything a request raised into one, using vLLM's
own exception → status mapping for vLLM's errors so the statuses match `vllm serve`.
"""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.exceptions import VLLMError
from vllm.v1.engine.exceptions import EngineDeadError

from decode_server.config import RETRY_AFTER_S

log = logging.getLogger("decode_server.errors")


class ServerError(Exception):
    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        reason: str = "invalid",
        error_type: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        # A short, bounded label for metrics (never the message itself).
        self.reason = reason
        # vLLM's `type` field when vLLM named the error; else derived from the status.
        self.error_type = error_type

    @property
    def headers(self) -> dict[str, str] | None:
        # Every 503 is transient here (overload, draining, a dead engine being replaced).
        if self.status == 503:
            return {"Retry-After": str(RETRY_AFTER_S)}
        # A 408 leaves the rest of its body unread on the connection: close it (RFC 9110 15.5.9;
        # uvicorn closes a connection whose response says `Connection: close`).
        if self.status == 408:
            return {"Connection": "close"}
        return None


class Rejected(ServerError):
    """The request itself is at fault (4xx), or the server cannot take it now (503)."""


class ClientDisconnected(Exception):
    """The client went away before the answer was ready."""


class EngineGenerationError(Exception):
    """The engine finished a choice with finish_reason "error"."""


ENGINE_DEAD = "the engine is dead; this server will restart"
DRAINING = "the server is draining (shutting down); retry on another replica"


def engine_dead(message: str = ENGINE_DEAD) -> Rejected:
    return Rejected(message, status=503, reason="engine_dead")


def draining(message: str = DRAINING) -> Rejected:
    return Rejected(message, status=503, reason="draining")


def body_timeout(timeout_s: float, received: int) -> Rejected:
    return Rejected(
        f"request body not received within {timeout_s:g} s (got {received} bytes)",
        status=408,
        reason="body_timeout",
    )


def describe(e: BaseException) -> ServerError:
    """The ServerError for anything a running request raised."""
    if isinstance(e, ServerError):
        return e
    # Starlette's: the client left while its body was being read.
    if isinstance(e, (ClientDisconnected, ClientDisconnect)):
        return ServerError("client disconnected", status=499, reason="client_disconnect")
    if isinstance(e, EngineDeadError) or isinstance(e.__cause__, EngineDeadError):
        return engine_dead()
    if isinstance(e, EngineGenerationError):
        return ServerError("Internal server error", status=500, reason="engine")
    # NotImplementedError: what vLLM's parsers raise where they only work elsewhere (the `openai`
    # tool parser outside harmony); vLLM answers it 501 with the parser's message.
    if isinstance(e, (VLLMError, NotImplementedError)):
        info = create_error_response(e).error
        reason = "engine_validation" if info.code < 500 else "engine_overload" if info.code == 503 else "engine"
        return ServerError(info.message, status=info.code, param=info.param, reason=reason, error_type=info.type)
    log.exception("unexpected error in a request", exc_info=e)
    return ServerError(f"internal error: {type(e).__name__}", status=500, reason="internal")
