"""LoRA adapters and the engine headers, as vLLM's generate serves them (issue #13, items 2 and 3).

Fast checks (no engine) drive the app in-process over a stub `AsyncLLM` that records the keyword
arguments of every `generate` call: the headers and the adapter reach the engine call. The real
server beside them serves a random-weight rank-8 adapter for the demo model's shapes: it changes
the model's greedy tokens, `/v1/models` lists it, one more loads and unloads at runtime, and
`/metrics` carries vLLM's `vllm:lora_requests_info`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient
from vllm.outputs import CompletionOutput, RequestOutput

from decode_server.http.app import build_app
from decode_server.config import ServerConfig
from decode_server.runtime.engine import Engine
from decode_server.process.server import Lifecycle
from tests import servers
from tests.support import GENERATE, post

ADAPTER = "my-adapter"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ENGINE_HEADERS = {"traceparent": TRACEPARENT, "tracestate": "vendor=1", "X-data-parallel-rank": "0", "X-Session-ID": "s-1"}


# ------------------------------------------------------------------ a random-weight adapter


def build_adapter(model_dir: Path, out: Path, seed: int, rank: int = 8, scale: float = 30.0) -> Path:
    """A PEFT LoRA on q_proj/v_proj of every layer, shaped from the model's config.json.

    The demo model's dummy weights are ~1e-3 and it runs in bf16: an adapter at a usual scale
    changes its logits below bf16's resolution, so this one is large enough to change greedy tokens.
    """
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, head_dim = cfg["hidden_size"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    outs = {"q_proj": cfg["num_attention_heads"] * head_dim, "v_proj": cfg["num_key_value_heads"] * head_dim}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for module, out_dim in outs.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) * scale
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_dim, rank, generator=gen) * scale
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "target_modules": list(outs), "bias": "none", "base_model_name_or_path": str(model_dir),
    }
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


# ------------------------------------------------------------------ fast: a stub engine


class RecordingLLM:
    """What `Engine` and vLLM's `OpenAIServingModels` read of an AsyncLLM; `generate` records its kwargs."""

    log_stats = False
    errored = False
    tokenizer = renderer = input_processor = None

    def __init__(self) -> None:
        self.model_config = SimpleNamespace(
            model="/models/base", max_model_len=4096, max_logprobs=20, hf_config=SimpleNamespace(),
            get_diff_sampling_param=dict, get_vocab_size=lambda: 1000,
        )
        self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=16), kv_transfer_config=None)
        self.calls: list[dict[str, Any]] = []
        self.added: list[Any] = []

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any):
        self.calls.append(kwargs)
        done = CompletionOutput(index=0, text="", token_ids=[7], cumulative_logprob=None, logprobs=None, finish_reason="length")
        yield RequestOutput(request_id, None, prompt["prompt_token_ids"], None, [done], True)

    async def add_lora(self, lora_request: Any) -> bool:
        self.added.append(lora_request)
        return True

    def shutdown(self) -> None:
        pass


@pytest.fixture
def stub():
    llm = RecordingLLM()
    config = ServerConfig(served_model_names=("base",), tokens_only=True, runtime_lora_updating=True, api_keys=("k",))
    app = build_app(lambda: Engine(llm, tokens_only=True), config, Lifecycle())
    with TestClient(app, headers={"Authorization": "Bearer k"}) as client:
        yield llm, client


def test_engine_headers_reach_the_engine_call(stub):
    llm, client = stub
    r = client.post(GENERATE, json={"token_ids": [1, 2]}, headers=ENGINE_HEADERS)
    assert r.status_code == 200, r.text
    call = llm.calls[-1]
    assert call["trace_headers"] == {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
    assert call["data_parallel_rank"] == 0
    assert call["session_id"] == "s-1"
    assert call["lora_request"] is None


def test_without_the_headers_the_engine_gets_none(stub):
    llm, client = stub
    r = client.post(GENERATE, json={"token_ids": [1, 2]}, headers={"X-data-parallel-rank": "x"})
    assert r.status_code == 200, r.text
    call = llm.calls[-1]
    assert (call["trace_headers"], call["data_parallel_rank"], call["session_id"]) == (None, None, None)


def test_model_picks_the_adapter_and_unknown_is_404(stub):
    llm, client = stub
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/adapters/a"})
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'a' added successfully.")
    assert llm.added[-1].lora_name == "a"
    r = client.post(GENERATE, json={"token_ids": [1], "model": "a"})
    assert r.status_code == 200 and r.json()["model"] == "a"
    assert llm.calls[-1]["lora_request"].lora_path == "/adapters/a"
    for base in ({"model": ""}, {"model": "base"}, {}):
        r = client.post(GENERATE, json={"token_ids": [1], **base})
        assert r.status_code == 200 and r.json()["model"] == "base"
        assert llm.calls[-1]["lora_request"] is None
    r = client.post(GENERATE, json={"token_ids": [1], "model": "x"})
    assert r.status_code == 404 and r.json()["error"]["message"] == "The model `x` does not exist."
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert (cards["a"]["parent"], cards["a"]["root"]) == ("base", "/adapters/a")


def test_load_and_unload_bodies_and_statuses_are_vllms(stub):
    _, client = stub
    ok = {"lora_name": "a", "lora_path": "/adapters/a"}
    assert client.post("/v1/load_lora_adapter", json=ok).status_code == 200
    again = client.post("/v1/load_lora_adapter", json=ok)
    assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]
    base = client.post("/v1/load_lora_adapter", json={"lora_name": "base", "lora_path": "/p"})
    assert base.status_code == 400 and "conflicts with a served base model" in base.json()["error"]["message"]
    assert client.post("/v1/load_lora_adapter", json={"lora_name": "b"}).status_code == 400
    assert client.post("/v1/load_lora_adapter", content=b"{").status_code == 400
    r = client.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'a' removed successfully.")
    gone = client.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
    assert gone.status_code == 404 and gone.json()["error"]["message"] == "The lora adapter 'a' cannot be found."
    assert client.post(GENERATE, json={"token_ids": [1], "model": "a"}).status_code == 404
    assert client.post("/v1/unload_lora_adapter", json={"lora_name": "a"}, headers={"Authorization": ""}).status_code == 401


def test_the_lora_routes_exist_only_with_runtime_updating():
    app = build_app(lambda: None, ServerConfig(served_model_names=("base",)), None)
    paths = {route.path for route in app.routes}
    assert "/v1/load_lora_adapter" not in paths and "/v1/unload_lora_adapter" not in paths


# ------------------------------------------------------------------ a real engine with adapters


@pytest.fixture(scope="module")
def adapters(demo_model, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    return {name: build_adapter(demo_model, root / name, seed) for name, seed in ((ADAPTER, 1), ("second", 2))}


@pytest.fixture(scope="module")
def lora_server(demo_model, log_dir, adapters):
    flags = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--lora-modules", f"{ADAPTER}={adapters[ADAPTER]}"]
    server = servers.ours("lora", demo_model, log_dir, *flags, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"})
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _greedy(url: str, model: str | None) -> list[int]:
    """The greedy tokens (no replay script: the model's own choice) under `model`."""
    r = post(url, {"token_ids": [9707, 1879], "sampling_params": {"max_tokens": 8, "temperature": 0}, "model": model})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == (model or servers.MODEL_NAME)
    return r.json()["choices"][0]["token_ids"]


def test_the_adapter_serves_and_changes_the_model(lora_server):
    base = _greedy(lora_server.url, None)
    tuned = _greedy(lora_server.url, ADAPTER)
    assert base != tuned, "the adapter's weights did not reach the model"
    assert _greedy(lora_server.url, ADAPTER) == tuned


def test_unknown_model_is_404_with_the_reason(lora_server):
    r = post(lora_server.url, {"token_ids": [1], "sampling_params": {"max_tokens": 1}, "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["message"] == "The model `nope` does not exist."


def test_models_lists_the_adapter_with_its_parent(lora_server, adapters):
    cards = {m["id"]: m for m in httpx.get(lora_server.url + "/v1/models", timeout=10).json()["data"]}
    assert cards[ADAPTER]["parent"] == servers.MODEL_NAME
    assert cards[ADAPTER]["root"] == str(adapters[ADAPTER])


def test_runtime_load_generate_unload(lora_server, adapters):
    url = lora_server.url
    r = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "second", "lora_path": str(adapters["second"])}, timeout=120)
    assert r.status_code == 200, r.text
    assert "second" in {m["id"] for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]}
    assert _greedy(url, "second") != _greedy(url, ADAPTER)
    r = httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "second"}, timeout=30)
    assert r.status_code == 200, r.text
    assert post(url, {"token_ids": [1], "sampling_params": {"max_tokens": 1}, "model": "second"}).status_code == 404


def test_metrics_carry_vllms_lora_requests_info(lora_server):
    _greedy(lora_server.url, ADAPTER)
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(lora_server.url + "/metrics", timeout=10).text
        if f'running_lora_adapters="{ADAPTER}"' in text or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert "vllm:lora_requests_info{" in text
    assert f'running_lora_adapters="{ADAPTER}"' in text


def test_the_real_server_accepts_the_engine_headers(lora_server):
    for model in (None, ADAPTER):
        body = {"token_ids": [9707, 1879], "sampling_params": {"max_tokens": 2}, "model": model}
        r = post(lora_server.url, body, headers=ENGINE_HEADERS)
        assert r.status_code == 200, r.text
    # The engine checks the rank (one data-parallel rank here): vLLM's 400, not a 500.
    r = post(lora_server.url, {"token_ids": [1], "sampling_params": {"max_tokens": 1}}, headers={"X-data-parallel-rank": "5"})
    assert r.status_code == 400 and "data_parallel_rank 5 is out of range" in r.json()["error"]["message"]
