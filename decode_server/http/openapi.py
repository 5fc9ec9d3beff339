"""`/openapi.json`, generated from the protocol Structs (no hand-written schema to drift)."""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec

from protocol.errors import ErrorResponse
from protocol.generate import MODE_TYPES, AbortRequest, GenerateRequest


def _json(ref: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": ref}}


@cache
def openapi_document(version: str) -> dict[str, Any]:
    responses = [t.response for t in MODE_TYPES.values()]
    types = [GenerateRequest, ErrorResponse, AbortRequest, *responses]
    refs, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    req, error, abort, *response_refs = refs
    errors = {str(code): {"description": desc, "content": _json(error)} for code, desc in [
        (400, "Invalid request (the message names the cause)"),
        (401, "Missing or wrong API key"),
        (404, "Unknown model"),
        (409, "Parser configuration fingerprint mismatch"),
        (413, "Request body too large"),
        (503, "Engine dead or server draining"),
    ]}
    return {
        "openapi": "3.1.0",
        "info": {"title": "decode-server", "version": version},
        "paths": {
            "/inference/v1/generate": {
                "post": {
                    "operationId": "generate",
                    "requestBody": {"required": True, "content": _json(req)},
                    "responses": {
                        "200": {
                            "description": "Batch response, or an SSE stream when `stream` is true",
                            "content": {
                                **_json({"oneOf": response_refs}),
                                "text/event-stream": {"schema": {"type": "string"}},
                            },
                        },
                        **errors,
                    },
                }
            },
            "/inference/v1/abort_requests": {
                "post": {
                    "operationId": "abort_requests",
                    "requestBody": {"required": True, "content": _json(abort)},
                    "responses": {"200": {"description": "Aborted (unknown ids are a no-op)"}, **errors},
                }
            },
        },
        "components": {"schemas": components},
    }
