"""The P/D set the modules of tests/engine/pd/ share, and its parts.

Decode-server instances with vLLM's NixlConnector on loopback (`kv_buffer_device: cpu`, UCX),
the NIXL progress-thread hook (see tests/engine/pd/test_pd.py's docstring), seeded real weights, and the
/metrics reader both modules assert with.

One set of three engines serves both modules (`shared_set`): a prefill instance (`--tokens-only`,
kv_producer) and two decode instances (kv_consumer), one with `kv_load_failure_policy: recompute`,
the parsers and a long remote-prefill deadline (test_pd's decode pool: it proves what a leg
answers, not the deadline), one with vLLM's default `fail` and a short deadline (the faults'). All
three have a short NIXL lease and run UCX over TCP. A test that kills an instance kills a shared one;
the next module to use the set starts it again.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import servers
from tests.support.processes import signal_all
from tests.support.servers import start_all, stop_all

# The progress-thread poll timeout NIXL gets in the test servers (see the module docstring).
NIXL_PROGRESS_DELAY_US = 1000

_SITECUSTOMIZE = '''\
"""Test servers only: give NIXL's UCX progress thread a poll() timeout instead of a busy loop."""
import importlib.abc, importlib.machinery, importlib.util, os, sys

_DELAY_US = int(os.environ.get("DECODE_SERVER_TEST_NIXL_PTHR_DELAY_US", "%d"))


class _NixlProgressDelay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in ("nixl_cu12._api", "nixl_cu13._api"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            bindings = module.nixlBind
            new_agent = bindings.nixlAgent

            def nixl_agent(name, config):
                config.pthrDelay = _DELAY_US
                return new_agent(name, config)

            bindings.nixlAgent = nixl_agent

        spec.loader.exec_module = exec_module
        return spec


if _DELAY_US > 0:
    sys.meta_path.insert(0, _NixlProgressDelay())

# Keep any sitecustomize this one shadows.
_here = os.path.dirname(os.path.abspath(__file__))
_other = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here]
)
if _other is not None and _other.loader is not None:
    _module = importlib.util.module_from_spec(_other)
    _other.loader.exec_module(_module)
''' % NIXL_PROGRESS_DELAY_US


# ----------------------------------------------------------------- model with real weights


def write_seeded_weights(model_dir: Path, seed: int = 0) -> None:
    """model.safetensors with seeded random weights for the demo model's Qwen3 config.

    Scales: embeddings N(0, 0.3²) (tied to the LM head), every projection N(0, 1/fan_in),
    norms 1. Small embeddings keep the residual stream from being a copy of the last token,
    so attention over the whole prompt decides the next token.
    """
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["tie_word_embeddings"], "the weights below assume a tied LM head"
    g = torch.Generator().manual_seed(seed)
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def proj(out_dim: int, in_dim: int) -> Any:
        return (torch.randn(out_dim, in_dim, generator=g) / in_dim**0.5).to(torch.bfloat16)

    def ones(n: int) -> Any:
        return torch.ones(n, dtype=torch.bfloat16)

    tensors = {
        "model.embed_tokens.weight": (torch.randn(vocab, hidden, generator=g) * 0.3).to(torch.bfloat16),
        "model.norm.weight": ones(hidden),
    }
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors |= {
            p + "self_attn.q_proj.weight": proj(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": proj(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": proj(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": proj(hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": ones(head_dim),
            p + "self_attn.k_norm.weight": ones(head_dim),
            p + "mlp.gate_proj.weight": proj(inter, hidden),
            p + "mlp.up_proj.weight": proj(inter, hidden),
            p + "mlp.down_proj.weight": proj(hidden, inter),
            p + "input_layernorm.weight": ones(hidden),
            p + "post_attention_layernorm.weight": ones(hidden),
        }
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


def engine_flags_with_real_weights() -> list[str]:
    """The shared engine flags, loading the seeded weights, and eager: torch.compile's warm-up
    (inductor's C++ build) costs each start a minute or more on a small CPU box, and nothing here
    compares a compiled engine with an eager one."""
    flags = list(servers.ENGINE_FLAGS)
    i = flags.index("--load-format")
    flags[i + 1] = "safetensors"
    return flags if "--enforce-eager" in flags else [*flags, "--enforce-eager"]


def kv_config(role: str, extra_config: dict[str, Any] | None = None, **fields: Any) -> str:
    """vLLM's --kv-transfer-config JSON; `fields` such as kv_load_failure_policy, `extra_config`
    the connector's kv_connector_extra_config (e.g. kv_lease_duration)."""
    config = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu", **fields}
    if extra_config:
        config["kv_connector_extra_config"] = extra_config
    return json.dumps(config)


def omp_binds() -> tuple[str, str]:
    cpus = sorted(os.sched_getaffinity(0))
    return (str(cpus[0]), str(cpus[1])) if len(cpus) >= 2 else ("nobind", "nobind")


def salt() -> str:
    """A fresh cache_salt: no request here reuses another's KV through the local prefix cache."""
    return f"pd-{time.monotonic_ns()}-{random.random()}"


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        name = re.sub(r'(engine|model_name)="[^"]*",?', "", name).replace(",}", "}").replace("{}", "")
        out[name] = float(value)
    return out


def kv_usage(url: str) -> float:
    return metrics(url)["vllm:kv_cache_usage_perc"]


def seeded_model_dir(demo_model: Path, tmp_path_factory: Any) -> Path:
    target = tmp_path_factory.mktemp("pd-model") / "demo-seeded"
    shutil.copytree(demo_model, target)
    write_seeded_weights(target)
    return target


def require_nixl() -> None:
    try:
        import nixl  # noqa: F401
    except ImportError as e:  # the `test` extra pins nixl; a stale venv lacks it
        pytest.fail(f"NIXL is not importable ({e}); run ./dev setup (the test extra installs nixl==1.5.1)")


def nixl_env(tmp_path_factory: Any) -> dict[str, str]:
    """The environment every NIXL test server shares: the progress-thread hook on PYTHONPATH."""
    hook = tmp_path_factory.mktemp("nixl-hook")
    (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    pythonpath = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": pythonpath, "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "UCX_RCACHE_MAX_UNRELEASED": "1024"}


def nixl_server(
    name: str, model: Path, log_dir: Path, env: dict[str, str], kv_transfer_config: str, *extra: str, bind: str = "nobind"
) -> servers.Server:
    """A decode-server with the NixlConnector (`extra`: more flags, e.g. --tokens-only or parsers)."""
    argv = [sys.executable, "-m", "decode_server.process.cli", "serve", str(model), *engine_flags_with_real_weights()]
    side_channel = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(servers.free_port()), "VLLM_CPU_OMP_THREADS_BIND": bind}
    server = servers.Server(name, [*argv, *extra, "--kv-transfer-config", kv_transfer_config], log_dir, env={**env, **side_channel})
    server.port_env = ("VLLM_NIXL_SIDE_CHANNEL_PORT",)
    return server


# ----------------------------------------------------------------- the shared set

LEASE_S = 5  # kv_lease_duration on all three (vLLM's default: 30)
# DECODE_SERVER_REMOTE_PREFILL_TIMEOUT_S on the `fail` instance: above vLLM's 5 s handshake timeout
# (which starts up to ~2.5 s late on a loaded 2-core box), so an unreachable side channel is its 502.
FAIL_DEADLINE_S = 9.0
# ... on the `recompute` one, test_pd's decode pool: one full-suite run saw a single transfer stall
# past the default 8 s (the next leg's first token then took 1.3 s, the others ~30 ms).
RECOMPUTE_DEADLINE_S = 30.0


class PDSet:
    def __init__(self, prefill: servers.Server, fail: servers.Server, recompute: servers.Server):
        self.prefill, self.fail, self.recompute = prefill, fail, recompute

    @property
    def everyone(self) -> list[servers.Server]:
        return [self.prefill, self.fail, self.recompute]


def _new_set(demo_model: Path, log_dir: Path, tmp_path_factory: Any) -> PDSet:
    model = seeded_model_dir(demo_model, tmp_path_factory)
    # UCX over TCP, as between two hosts without RDMA: a read then needs the prefill process's own
    # progress, so a stopped prefill instance stalls it. (Over shared memory / CMA on one host a
    # stopped process's memory can still be read, and the stall may not stall.)
    env = {**nixl_env(tmp_path_factory), "UCX_TLS": "tcp,self"}
    lease = {"kv_lease_duration": LEASE_S}
    p_bind, d_bind = omp_binds()
    prefill = nixl_server("pd-prefill", model, log_dir, env, kv_config("kv_producer", lease), "--tokens-only", bind=p_bind)
    fail = nixl_server(
        "pd-decode-fail", model, log_dir,
        {**env, "DECODE_SERVER_REMOTE_PREFILL_TIMEOUT_S": str(FAIL_DEADLINE_S)},
        kv_config("kv_consumer", lease, kv_load_failure_policy="fail"),
    )
    recompute = nixl_server(
        "pd-decode-recompute", model, log_dir,
        {**env, "DECODE_SERVER_REMOTE_PREFILL_TIMEOUT_S": str(RECOMPUTE_DEADLINE_S)},
        kv_config("kv_consumer", lease, kv_load_failure_policy="recompute"), *servers.PARSER_FLAGS, bind=d_bind,
    )
    return PDSet(prefill, fail, recompute)


def running_set(demo_model: Path, log_dir: Path, tmp_path_factory: Any) -> Iterator[PDSet]:
    """The body of tests/engine/pd's `pd_set` fixture: the set started, and stopped after the
    package's modules (test_pd.py, test_pd_behind_llm_d.py, then test_pd_faults.py, whose last tests kill instances)."""
    require_nixl()
    pd = _new_set(demo_model, log_dir, tmp_path_factory)
    try:
        start_all(pd.everyone)
        yield pd
    finally:
        for s in pd.everyone:  # a stopped (SIGSTOP) server or engine would not see the SIGTERM
            signal_all(s, signal.SIGCONT)
        stop_all(pd.everyone)
