"""LoRA adapters and the engine headers on a real engine (issue #13, items 2 and 3).

The production-like server (tests/support/prod_server.py: every frontend flag, so these requests carry its
API key) serves a random-weight rank-8 adapter for the demo model's shapes: it changes the model's
greedy tokens, `/v1/models` lists it, one more loads and unloads at runtime, and `/metrics` carries
vLLM's `vllm:lora_requests_info`. The route rules (load/unload bodies and statuses, adapter
resolution, the headers reaching the engine) run in process: tests/app/runtime/test_lora.py.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support import servers
from tests.support.prod_server import ADAPTER, auth
from tests.support import GENERATE
from tests.app.runtime.test_lora import ENGINE_HEADERS

pytestmark = pytest.mark.real_engine


@pytest.fixture
def http(prod_server):
    with httpx.Client(base_url=prod_server.url, headers=auth(), timeout=120) as client:
        yield client


def _greedy(http: httpx.Client, model: str | None) -> list[int]:
    """The greedy tokens (no replay script: the model's own choice) under `model`."""
    r = http.post(GENERATE, json={"token_ids": [9707, 1879], "sampling_params": {"max_tokens": 8, "temperature": 0}, "model": model})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == (model or servers.MODEL_NAME)
    return r.json()["choices"][0]["token_ids"]


def test_the_adapter_serves_and_changes_the_model(http):
    base = _greedy(http, None)
    tuned = _greedy(http, ADAPTER)
    assert base != tuned, "the adapter's weights did not reach the model"
    assert _greedy(http, ADAPTER) == tuned


def test_unknown_model_is_404_with_the_reason(http):
    r = http.post(GENERATE, json={"token_ids": [1], "sampling_params": {"max_tokens": 1}, "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["message"] == "The model `nope` does not exist."


def test_models_lists_the_adapter_with_its_parent(http, lora_adapters):
    cards = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert cards[ADAPTER]["parent"] == servers.MODEL_NAME
    assert cards[ADAPTER]["root"] == str(lora_adapters[ADAPTER])


def test_runtime_load_generate_unload(http, lora_adapters):
    r = http.post("/v1/load_lora_adapter", json={"lora_name": "second", "lora_path": str(lora_adapters["second"])})
    assert r.status_code == 200, r.text
    assert "second" in {m["id"] for m in http.get("/v1/models").json()["data"]}
    assert _greedy(http, "second") != _greedy(http, ADAPTER)
    r = http.post("/v1/unload_lora_adapter", json={"lora_name": "second"})
    assert r.status_code == 200, r.text
    assert http.post(GENERATE, json={"token_ids": [1], "sampling_params": {"max_tokens": 1}, "model": "second"}).status_code == 404


def test_metrics_carry_vllms_lora_requests_info(http):
    _greedy(http, ADAPTER)
    deadline = time.monotonic() + 10
    while True:
        text = http.get("/metrics").text
        if f'running_lora_adapters="{ADAPTER}"' in text or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert "vllm:lora_requests_info{" in text
    assert f'running_lora_adapters="{ADAPTER}"' in text


def test_the_real_server_accepts_the_engine_headers(http):
    for model in (None, ADAPTER):
        body = {"token_ids": [9707, 1879], "sampling_params": {"max_tokens": 2}, "model": model}
        r = http.post(GENERATE, json=body, headers=ENGINE_HEADERS)
        assert r.status_code == 200, r.text
    # The engine checks the rank (one data-parallel rank here): vLLM's 400, not a 500.
    r = http.post(GENERATE, json={"token_ids": [1], "sampling_params": {"max_tokens": 1}}, headers={"X-data-parallel-rank": "5"})
    assert r.status_code == 400 and "data_parallel_rank 5 is out of range" in r.json()["error"]["message"]
