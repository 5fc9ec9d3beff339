"""Reading the rendered Kubernetes manifests under deploy/: the server's containers, their argv, env,
probes and quantities, and the constants the manifest tests hold them to (tests/deploy/test_manifest_*.py)."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

from tests.support.deploy_render import (
    COMPOSITIONS, KUSTOMIZATIONS, OBSERVABILITY, all_containers, of_kind, pod_spec, port_numbers,
)

SERVER = "decode-server"  # the server's container name in every pool
SHUTDOWN_TIMEOUT_FLAG = "--shutdown-timeout"  # vLLM's drain flag; the server's only drain knob
# After the drain deadline: aborted streams' last chunks, engine teardown, exit (llm-d's
# graceful-shutdown component budgets 15 s for the same).
TEARDOWN_MARGIN_S = 15
PARSER_FLAGS = ["--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
PART_OF = "app.kubernetes.io/part-of"

# llm-d's P/D guide (guides/pd-disaggregation/.../patch-decode.yaml): the model server's probes.
LLM_D_PROBES = {
    "startupProbe": {"initialDelaySeconds": 15, "periodSeconds": 30, "timeoutSeconds": 5, "failureThreshold": 120},
    "livenessProbe": {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
    "readinessProbe": {"periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 3},
}

# The routing sidecar's flags in llm-d-router v0.10.0 (pkg/sidecar/proxy/options.go, plus the zap
# logging flags). It parses them with pflag: `--flag=value`; a single dash is a shorthand cluster.
SIDECAR_FLAGS = {
    "cert-path", "configuration", "configuration-file", "data-parallel-size", "decode-chunk-size",
    "ec-connector", "enable-p2p-pull", "enable-prefiller-sampling", "enable-ssrf-protection", "enable-tls",
    "inference-pool", "kv-connector", "max-idle-conns-per-host", "metrics-port", "model-server-port",
    "mooncake-bootstrap-port", "p2p-connector-port", "pool-group", "port", "prefill-max-retries",
    "prefill-retry-backoff", "secure-proxy", "tls-insecure-skip-verify", "tracing",
    "moriio-decode-handshake-port", "moriio-decode-hosts", "moriio-decode-notify-port", "moriio-dp-size",
    "moriio-dp-size-local", "moriio-local-pod-ip", "moriio-parallel-decode-wait-timeout",
    "moriio-parallel-dispatch", "moriio-prefill-handshake-port", "moriio-prefill-notify-port",
    "moriio-remote-hosts", "moriio-tp-size", "moriio-write-mode",
    "zap-devel", "zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding",
}
SIDECAR_DEPRECATED_FLAGS = {"vllm-port": "model-server-port"}
SIDECAR_KV_CONNECTORS = {"nixlv2", "shared-storage", "sglang", "mooncake", "offloading"}
SA_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# ---------------------------------------------------------------- rendering helpers


def server_deployments(docs: list[dict]) -> list[dict]:
    return [d for d in of_kind(docs, "Deployment") if any(c["name"] == SERVER for c in pod_spec(d)["containers"])]


def server_container(deployment: dict) -> dict:
    (c,) = [c for c in pod_spec(deployment)["containers"] if c["name"] == SERVER]
    return c


def sidecar(deployment: dict, name: str = "routing-sidecar") -> dict:
    matches = [c for c in pod_spec(deployment).get("initContainers", []) if c["name"] == name]
    assert len(matches) == 1, f"Deployment/{deployment['metadata']['name']} has no init container {name}"
    return matches[0]


def env_map(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def expand(c: dict) -> list[str]:
    """The container's argv after Kubernetes' $(VAR) expansion of literal env values."""
    values = {name: e["value"] for name, e in env_map(c).items() if "value" in e}
    argv = [*c.get("command", []), *c.get("args", [])]
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m[1], m[0]), a) for a in argv]


def flag_value(argv: list[str], flag: str) -> str:
    assert flag in argv, f"{flag} missing from {argv}"
    return argv[argv.index(flag) + 1]


def resolves_to_a_port(target: int | str, deployment: dict) -> bool:
    if isinstance(target, int):
        return target in {p["containerPort"] for c in all_containers(deployment) for p in c.get("ports", [])}
    return target in port_numbers(deployment)


def probe_port(c: dict, probe: dict) -> int:
    port = probe["httpGet"]["port"]
    return port if isinstance(port, int) else {p["name"]: p["containerPort"] for p in c["ports"]}[port]


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTORS = {None: 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: str | int) -> Fraction:
    """A Kubernetes resource quantity, exactly (the forms these manifests use)."""
    m = _QUANTITY.match(str(value))
    assert m, f"unparsed quantity {value!r}"
    return Fraction(m[1]) * _FACTORS[m[2]]


def pre_stop_seconds(c: dict) -> int:
    pre_stop = c["lifecycle"]["preStop"]
    if "sleep" in pre_stop:
        return pre_stop["sleep"]["seconds"]
    command = pre_stop["exec"]["command"]
    assert Path(command[0]).name == "sleep" and len(command) == 2, f"preStop is not a plain sleep: {command}"
    return int(command[1])


# Every tree an operator can apply: each kustomization, and each component on the pool overlays.
TREES = [*KUSTOMIZATIONS, *COMPOSITIONS]
# Trees that run the pools (deploy/observability holds only the rule and the dashboard).
POOL_TREES = [t for t in TREES if t != OBSERVABILITY]
