"""LoRA adapters and the engine headers, in process (issue #13, items 2 and 3).

The app over the scripted engine with vLLM's own `OpenAIServingModels`: loading and unloading go
through it to the engine (the scripted core keeps the adapters it was given), and a request's
`model` picks the `LoRARequest` the engine gets. The real-engine check (an adapter that changes the
model's tokens, runtime load/unload, vLLM's LoRA metrics) is tests/engine/prod/test_lora.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.inprocess import InProcess, error_of, serve
from tests.support import GENERATE

pytestmark = pytest.mark.anyio

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ENGINE_HEADERS = {"traceparent": TRACEPARENT, "tracestate": "vendor=1", "X-data-parallel-rank": "0", "X-Session-ID": "s-1"}
AUTH = {"Authorization": "Bearer k"}
LORA_FLAGS = ("--enable-lora", "--max-lora-rank", "8", "--api-key", "k")


@pytest.fixture
async def lora(demo_model, monkeypatch) -> AsyncIterator[InProcess]:
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "true")
    async with serve(demo_model, *LORA_FLAGS) as s:
        s.client.headers.update(AUTH)
        yield s


@pytest.fixture
def generate_calls(lora, monkeypatch) -> list[dict[str, Any]]:
    """The keyword arguments of every `generate` call our Engine makes on vLLM's AsyncLLM (which
    drops trace headers before the engine core unless tracing is configured)."""
    calls: list[dict[str, Any]] = []
    real = lora.llm.generate

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(lora.llm, "generate", recording)
    return calls


async def test_engine_headers_reach_the_engine_call(lora, generate_calls):
    r = await lora.client.post(GENERATE, json={"token_ids": [1, 2]}, headers=ENGINE_HEADERS)
    assert r.status_code == 200, r.text
    assert generate_calls[-1]["trace_headers"] == {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
    sent = lora.core.seen[-1]
    assert (sent.data_parallel_rank, sent.session_id, sent.lora_request) == (0, "s-1", None)


async def test_without_the_headers_the_engine_gets_none(lora, generate_calls):
    r = await lora.client.post(GENERATE, json={"token_ids": [1, 2]}, headers={"X-data-parallel-rank": "x"})
    assert r.status_code == 200, r.text
    sent = lora.core.seen[-1]
    assert (generate_calls[-1]["trace_headers"], sent.data_parallel_rank, sent.session_id) == (None, None, None)


async def test_model_picks_the_adapter_and_unknown_is_404(lora):
    client = lora.client
    r = await client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/adapters/a"})
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'a' added successfully.")
    assert [adapter.lora_name for adapter in lora.core.loras.values()] == ["a"]
    r = await client.post(GENERATE, json={"token_ids": [1], "model": "a"})
    assert r.status_code == 200 and r.json()["model"] == "a"
    assert lora.core.seen[-1].lora_request.lora_path == "/adapters/a"
    for base in ({"model": ""}, {"model": "demo"}, {}):
        r = await client.post(GENERATE, json={"token_ids": [1], **base})
        assert r.status_code == 200 and r.json()["model"] == "demo"
        assert lora.core.seen[-1].lora_request is None
    r = await client.post(GENERATE, json={"token_ids": [1], "model": "x"})
    assert error_of(r) == (404, "The model `x` does not exist.", "model")
    cards = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert (cards["a"]["parent"], cards["a"]["root"]) == ("demo", "/adapters/a")


async def test_load_and_unload_bodies_and_statuses_are_vllms(lora):
    client = lora.client
    ok = {"lora_name": "a", "lora_path": "/adapters/a"}
    assert (await client.post("/v1/load_lora_adapter", json=ok)).status_code == 200
    code, message, _ = error_of(await client.post("/v1/load_lora_adapter", json=ok))
    assert code == 400 and "has already been loaded" in message
    code, message, _ = error_of(await client.post("/v1/load_lora_adapter", json={"lora_name": "demo", "lora_path": "/p"}))
    assert code == 400 and "conflicts with a served base model" in message
    r = await client.post("/v1/load_lora_adapter", json={"lora_name": "b"})
    assert error_of(r) == (400, "invalid request: Field required", "lora_path")
    code, message, _ = error_of(await client.post("/v1/load_lora_adapter", content=b"{"))
    assert code == 400 and message.startswith("invalid request: Invalid JSON: EOF while parsing")
    r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'a' removed successfully.")
    assert error_of(await client.post("/v1/unload_lora_adapter", json={"lora_name": "a"})) == (
        404, "The lora adapter 'a' cannot be found.", None,
    )
    assert error_of(await client.post(GENERATE, json={"token_ids": [1], "model": "a"}))[0] == 404
    r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "a"}, headers={"Authorization": ""})
    assert error_of(r) == (401, "missing or wrong API key (send 'Authorization: Bearer <key>')", None)


async def test_the_lora_routes_exist_only_with_runtime_updating(demo_model, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    async with serve(demo_model, "--enable-lora", "--max-lora-rank", "8") as s:
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            r = await s.client.post(path, json={"lora_name": "a", "lora_path": "/adapters/a"})
            assert (r.status_code, r.text) == (404, "Not Found"), path
        assert s.core.loras == {}
