"""API-key middleware: `Authorization: Bearer <key>` on the routes the app's route table guards."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

import msgspec
from starlette.types import ASGIApp, Receive, Scope, Send

from protocol.errors import error_body

_UNAUTHORIZED = msgspec.json.encode(error_body(401, "missing or wrong API key (send 'Authorization: Bearer <key>')"))


class ApiKeyMiddleware:
    """Constant-time compare against every configured key, on the guarded paths only (the app's
    generate, abort and adapter routes; health, readiness, metrics and models stay open)."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...], paths: Iterable[str]):
        self.app = app
        self._expected = [f"Bearer {key}".encode() for key in keys]
        self._paths = frozenset(paths)

    def _authorized(self, scope: Scope) -> bool:
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        # Compare against every key (no early exit), so timing does not tell which one matched.
        return sum(hmac.compare_digest(given, expected) for expected in self._expected) > 0

    def _guarded(self, scope: Scope) -> bool:
        # As vLLM's AuthenticationMiddleware: CORS preflights pass; paths are matched below root_path.
        if scope["type"] != "http" or scope.get("method") == "OPTIONS":
            return False
        return scope["path"].removeprefix(scope.get("root_path", "")) in self._paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._guarded(scope) and not self._authorized(scope):
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_UNAUTHORIZED)).encode())]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": _UNAUTHORIZED})
            return
        await self.app(scope, receive, send)
