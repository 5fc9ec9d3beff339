"""What a request gets when vLLM's own parser raises on the model's output (or on being built).

Coupled chat answers such an exception with vLLM's exception → status mapping (a ValueError, as a
JSONDecodeError on a call cut by max_tokens, is a 400 BadRequestError; an unknown one a 500), and
its message is the bare exception text ("Unterminated string starting at: …"), which reads as if
the client's request were malformed. We keep vLLM's status and type, so a client's retry rules
work the same, and say in the message that the parser failed on the model output, which parser,
and the exception (docs/vllm-differences.md#derender-parser-errors). Without this the exception
reached the app as an unknown one: a bare "internal error" 500.
"""

from __future__ import annotations

import logging

from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

from decode_server.config import DerenderConfig
from decode_server.errors import ServerError

log = logging.getLogger("decode_server.generate.derender")


def parser_failed(e: Exception, config: DerenderConfig) -> ServerError:
    """The ServerError for an exception vLLM's parser raised (a ServerError passes as it is)."""
    if isinstance(e, ServerError):
        return e
    info = create_error_response(e).error
    if isinstance(e, NotImplementedError):
        # a parser that does not work in this configuration at all (openai's outside harmony): it
        # parsed nothing, and vLLM's own message already says why (501 "... is a stub. Use ...")
        return ServerError(info.message, status=info.code, reason="parser", error_type=info.type)
    log.warning("vLLM's parser raised on the model output", exc_info=e)
    return ServerError(
        f"vLLM's parser ({_parsers(config)}) could not parse the model output: {type(e).__name__}: {info.message}",
        status=info.code,
        reason="parser",
        error_type=info.type,
    )


def _parsers(config: DerenderConfig) -> str:
    named = [("--tool-call-parser", config.tool_call_parser), ("--reasoning-parser", config.reasoning_parser)]
    return ", ".join(f"{flag} {name}" for flag, name in named if name) or "no parser flag"
