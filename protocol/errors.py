"""The error body every non-2xx answer carries, shaped as vLLM's ErrorResponse."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

# Long messages (a whole echoed prompt, vllm#49239) are cut so an error body stays small.
MAX_ERROR_MESSAGE_CHARS = 2000


class ErrorInfo(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(msgspec.Struct):
    error: ErrorInfo


_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    408: "RequestTimeout",
    409: "ConflictError",
    413: "RequestEntityTooLarge",
    422: "UnprocessableEntityError",
    499: "ClientDisconnected",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def error_body(code: int, message: str, param: str | None = None, error_type: str | None = None) -> ErrorResponse:
    if len(message) > MAX_ERROR_MESSAGE_CHARS:
        message = message[:MAX_ERROR_MESSAGE_CHARS] + "... (truncated)"
    return ErrorResponse(ErrorInfo(message, error_type or _TYPES.get(code, "Error"), param, code))


class GenerateError(Exception):
    """A client-facing error; the client raises it with the server's answer.

    `status` is the HTTP status (for an error event inside a 200 stream: the event's `code`),
    `message` and `param` come from the error body, `headers` are the response's headers
    (case-insensitive where the client passes httpx's) and `body` its raw bytes (for a stream
    error event: the event's data).
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
    ):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.param = param
        self.headers: Mapping[str, str] = headers if headers is not None else {}
        self.body = body
