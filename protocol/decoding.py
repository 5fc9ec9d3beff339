"""Decoding a generate request as vLLM's pydantic model would: lax types, unknown sampling keys ignored."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from protocol.generate import GenerateRequest


# Lax, as vLLM's pydantic models: "8" and 8.0 are 8, "true" and 1 are true.
_lax_request = msgspec.json.Decoder(GenerateRequest, strict=False)
_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `([^`]+)` - at `\$((?:\.[A-Za-z_][A-Za-z0-9_]*)*)`$")
MAX_IGNORED_FIELDS = 64


def decode_generate_request(body: bytes) -> tuple[GenerateRequest, list[str]]:
    """The request, and the dotted paths of the fields it had that this protocol does not know.

    As vLLM, unknown keys (in `sampling_params` too) are ignored rather than refused: during a
    rolling upgrade the render tier may be newer than this server. The fast path decodes once;
    only a body with unknown `sampling_params` fields is decoded again without them (vLLM's
    other nested models, e.g. `reasoning_parser_kwargs`, forbid unknown fields: so do we).
    """
    try:
        return _lax_request.decode(body), []
    except msgspec.ValidationError as e:
        error = e
    data: Any = None
    ignored: list[str] = []
    for _ in range(MAX_IGNORED_FIELDS):
        match = _UNKNOWN_FIELD.match(str(error))
        if match is None or not match.group(2).startswith(".sampling_params"):
            raise error
        if data is None:
            data = msgspec.json.decode(body)
        path = [part for part in match.group(2).split(".") if part]
        holder = data
        for part in path:
            holder = holder[part]
        holder.pop(match.group(1), None)
        ignored.append(".".join([*path, match.group(1)]))
        try:
            return msgspec.convert(data, GenerateRequest, strict=False), ignored
        except msgspec.ValidationError as e:
            error = e
    raise error
