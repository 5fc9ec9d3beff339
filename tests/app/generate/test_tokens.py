"""The service rules around the tokens level, in process: aborting an unknown id, unknown and
mistyped fields, the X-Request-Id header, the service endpoints.

The tokens level's real-engine checks stay in tests/app/vllm/test_tokens.py (wire shape and parity with
vLLM's own generate); real aborts in test_operations, test_faults and test_reliability.
"""

from __future__ import annotations

import pytest

from tests.support.inprocess import PROMPT, error_of
from tests.support import GENERATE

pytestmark = pytest.mark.anyio


async def test_abort_of_an_unknown_id_is_a_noop_200(inproc):
    for path in ("/abort_requests", "/inference/v1/abort_requests"):
        r = await inproc.client.post(path, json={"request_ids": ["never-seen"]})
        assert (r.status_code, r.text) == (200, ""), path
    assert inproc.core.aborted == []


async def test_unknown_top_level_fields_are_ignored(inproc):
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 2}, "future_field": {"x": 1}}
    r = await inproc.client.post(GENERATE, json=body)
    assert r.status_code == 200, r.text
    assert inproc.core.seen[-1].prompt_token_ids == PROMPT


async def test_wrong_type_is_a_400_naming_the_field(inproc):
    r = await inproc.client.post(GENERATE, json={"token_ids": PROMPT, "sampling_params": {"max_tokens": "eight"}})
    code, message, _ = error_of(r)
    assert code == 400 and "sampling_params.max_tokens" in message, r.text
    assert r.json()["error"]["type"] == "Bad Request", "the type vLLM's schema errors carry"


async def test_x_request_id_header_names_the_request(inproc):
    r = await inproc.client.post(GENERATE, json={"token_ids": PROMPT, "sampling_params": {"max_tokens": 1}}, headers={"X-Request-Id": "hdr-7"})
    assert r.json()["request_id"] == "generate-tokens-hdr-7"
    assert r.headers["x-request-id"] == "hdr-7"
    both = {"token_ids": PROMPT, "request_id": "body-id", "sampling_params": {"max_tokens": 1}}
    r = await inproc.client.post(GENERATE, json=both, headers={"X-Request-Id": "hdr-8"})
    assert r.json()["request_id"] == "generate-tokens-hdr-8", "as vLLM: the header wins over the body"


async def test_service_endpoints(inproc):
    client = inproc.client
    models = (await client.get("/v1/models")).json()
    assert models["data"][0]["id"] == "demo" and models["data"][0]["max_model_len"] == 4096
    assert (await client.get("/version")).json()["vllm"].startswith("0.32")
    spec = (await client.get("/openapi.json")).json()
    assert "GenerateRequest" in spec["components"]["schemas"]
    assert "/inference/v1/generate" in spec["paths"]
    r = await client.post(GENERATE, json={"token_ids": PROMPT, "sampling_params": {"max_tokens": 3, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    assert await inproc.metric("vllm:generation_tokens_total") >= 3
    assert await inproc.metric("decode_server_requests_total", output_mode="tokens", status="200") == 1
