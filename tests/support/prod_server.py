"""The production-like server: every frontend flag (tests/engine/prod/test_operations.py) and LoRA adapters
(tests/engine/prod/test_lora.py) on one real engine, started once for both (tests/engine/prod/conftest.py).

Its end is a test too (a SIGTERM to its process group drains DRAIN_STREAMS streams, then its log is
read back): the last tests of tests/engine/prod/test_operations.py, the package's last module.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import servers

KEYS = ("s3cret-key", "second-key")
ORIGIN = "https://ui.example"
# The drain at its end: this many streams of every mode, plus one that holds the drain open, none
# refused by the queue limit (vLLM counts waiting and running requests alike, each of a request's n
# sequences as one), and a window they all end well inside on 2 shared cores.
DRAIN_STREAMS = 16
QUEUE_LIMIT = DRAIN_STREAMS + 1  # a request with n above it is refused
# All of them running at once; and one above the queue limit, so that a request with n above it
# reaches vLLM's admission (our frontend refuses an n above max_num_seqs with a 400 first).
MAX_NUM_SEQS = QUEUE_LIMIT + 1
DRAIN_WINDOW_S = 180
ADAPTER = "my-adapter"
FRONTEND_FLAGS = (
    *servers.PARSER_FLAGS,
    "--api-key", *KEYS,
    "--log-format", "json",
    "--enable-prompt-tokens-details", "--return-tokens-as-token-ids",
    "--sse-keep-alive-interval", "1", "--enable-server-load-tracking",
    "--allowed-origins", f'["{ORIGIN}"]',
    "--middleware", "tests.support.tag_response",
    "--response-role", "narrator",
    "--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-queued-reqs", str(QUEUE_LIMIT),
    "--enable-scale-out", "--max-log-len", "5",
    "--shutdown-timeout", str(DRAIN_WINDOW_S),
)


def auth(key: str = KEYS[0]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def server(model_dir: Path, log_dir: Path, adapter: Path) -> servers.Server:
    """Not started yet (the package fixture starts it)."""
    lora = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--lora-modules", f"{ADAPTER}={adapter}"]
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}
    return servers.ours("prod", model_dir, log_dir, *FRONTEND_FLAGS, *lora, env=env)


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
