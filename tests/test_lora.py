"""LoRA adapters and the engine headers on a real engine (issue #13, items 2 and 3).

The server serves a random-weight rank-8 adapter for the demo model's shapes: it changes the
model's greedy tokens, `/v1/models` lists it, one more loads and unloads at runtime, and
`/metrics` carries vLLM's `vllm:lora_requests_info`. The route rules (load/unload bodies and
statuses, adapter resolution, the headers reaching the engine) run in process: tests/test_lora_inprocess.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from tests import servers
from tests.support import post
from tests.test_lora_inprocess import ENGINE_HEADERS

ADAPTER = "my-adapter"


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
