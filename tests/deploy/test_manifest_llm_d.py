"""The llm-d overlay: the routing sidecar fronts the decode server, the prefill pool takes its
prefill leg, RBAC lets it watch the pool and nothing else, and the EPP is wired. Starts no engine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.support.deploy_render import (
    LLM_D, kustomize_cmd, named, of_kind, pod_labels, pod_spec, port_numbers, render, selects,
)
from tests.support.manifests import (
    LLM_D_PROBES, SA_TOKEN_DIR, SIDECAR_DEPRECATED_FLAGS, SIDECAR_FLAGS, SIDECAR_KV_CONNECTORS, env_map,
    expand, flag_value, probe_port, resolves_to_a_port, server_container, sidecar,
)

# ---------------------------------------------------------------- llm-d


def sidecar_flags(c: dict) -> dict[str, str]:
    """The routing sidecar's argv as pflag reads it; fails on what it would not parse."""
    flags = {}
    for arg in expand(c):
        m = re.fullmatch(r"--([a-z0-9-]+)(?:=(.*))?", arg)
        assert m, f"{arg!r}: the sidecar takes --flag=value (pflag reads -flag as shorthands)"
        name, value = m[1], m[2] if m[2] is not None else "true"
        assert name not in SIDECAR_DEPRECATED_FLAGS, f"--{name} is deprecated: use --{SIDECAR_DEPRECATED_FLAGS[name]}"
        assert name in SIDECAR_FLAGS, f"--{name} is not a routing-sidecar flag"
        flags[name] = value
    return flags


def rules_for(docs: list[dict], service_account: str) -> list[dict]:
    """The namespaced RBAC rules bound to a ServiceAccount."""
    rules = []
    for binding in of_kind(docs, "RoleBinding"):
        if any(s["kind"] == "ServiceAccount" and s["name"] == service_account for s in binding["subjects"]):
            assert binding["roleRef"]["kind"] == "Role"
            rules += named(docs, "Role", binding["roleRef"]["name"])["rules"]
    return rules


def allowed(rules: list[dict], group: str, resource: str, verbs: set[str]) -> bool:
    granted = set()
    for r in rules:
        if group in r["apiGroups"] and resource in r["resources"]:
            granted |= set(r["verbs"])
    return verbs <= granted


@pytest.fixture(scope="module")
def llm_d():
    if kustomize_cmd() is None:
        pytest.skip("no kustomize or kubectl")
    return render(LLM_D)


def test_llm_d_sidecar_fronts_the_decode_server(llm_d):
    decode = named(llm_d, "Deployment", "decode-server-decode")
    (pool,) = of_kind(llm_d, "InferencePool")
    proxy = sidecar(decode)
    assert proxy.get("restartPolicy") == "Always", "a native sidecar: it outlives decode-server's drain on shutdown"
    flags = sidecar_flags(proxy)
    server_argv = expand(server_container(decode))
    public = int(flags["port"])
    assert public == 8000 == pool["spec"]["targetPorts"][0]["number"]
    assert [p["containerPort"] for p in proxy["ports"]] == [public]
    assert int(flags["model-server-port"]) == int(flag_value(server_argv, "--port")) == 8200
    assert flags["kv-connector"] == "nixlv2" and flags["kv-connector"] in SIDECAR_KV_CONNECTORS
    assert flags["secure-proxy"] == "false", "plain HTTP on the pool's target port"
    # The decode Service goes through the sidecar too.
    (svc_port,) = named(llm_d, "Service", "decode-server-decode")["spec"]["ports"]
    assert svc_port["targetPort"] == public
    # Probes hit decode-server itself, as llm-d's guide sets them.
    c = server_container(decode)
    for probe, expected in LLM_D_PROBES.items():
        assert probe_port(c, c[probe]) == 8200
        assert {k: c[probe].get(k) for k in expected} == expected, probe


def test_llm_d_prefill_pool_accepts_the_sidecars_prefill_leg(llm_d):
    """llm-d's sidecar forwards the caller's request with only max_tokens/min_tokens, stream and
    kv_transfer_params changed (and the caller's headers), so the prefill pool must accept every
    request the decode pool does and carry the same parser fingerprint: same flags, not
    --tokens-only; only the port and the KV role differ."""
    decode = expand(server_container(named(llm_d, "Deployment", "decode-server-decode")))
    prefill_d = named(llm_d, "Deployment", "decode-server-prefill")
    prefill = expand(server_container(prefill_d))
    assert "--tokens-only" not in prefill
    assert int(flag_value(prefill, "--port")) == 8000, "the EPP hands the sidecar the pool's target port"
    assert not pod_spec(prefill_d).get("initContainers"), "prefill pods take the prefill leg directly"

    def normalized(argv):
        argv = list(argv)
        argv[argv.index("--port") + 1] = "PORT"
        i = argv.index("--kv-transfer-config") + 1
        kv = json.loads(argv[i])
        argv[i] = json.dumps({k: v for k, v in kv.items() if k != "kv_role"}, sort_keys=True)
        return argv, kv["kv_role"]

    (d_argv, d_role), (p_argv, p_role) = normalized(decode), normalized(prefill)
    assert d_argv == p_argv
    assert (d_role, p_role) == ("kv_consumer", "kv_producer")
    for probe, expected in LLM_D_PROBES.items():
        assert {k: server_container(prefill_d)[probe].get(k) for k in expected} == expected, probe


def test_llm_d_sidecar_can_watch_the_pool_and_only_it_has_a_token(llm_d):
    """SSRF protection makes the sidecar list/watch the InferencePool and its pods. The pod mounts
    no token automatically; a projected token volume goes to the sidecar alone, and its
    ServiceAccount's Role grants exactly those reads."""
    decode = named(llm_d, "Deployment", "decode-server-decode")
    (pool,) = of_kind(llm_d, "InferencePool")
    spec = pod_spec(decode)
    proxy = sidecar(decode)
    flags = sidecar_flags(proxy)
    assert flags["enable-ssrf-protection"] == "true"
    namespace, _, pool_name = flags["inference-pool"].rpartition("/")
    assert pool_name == pool["metadata"]["name"]
    assert namespace == "$(POD_NAMESPACE)"
    assert env_map(proxy)["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"

    assert spec["automountServiceAccountToken"] is False
    account = named(llm_d, "ServiceAccount", spec["serviceAccountName"])
    assert account.get("automountServiceAccountToken") is False
    (mount,) = [m for m in proxy["volumeMounts"] if m["mountPath"] == SA_TOKEN_DIR]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    sources = volume["projected"]["sources"]
    token = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
    ca = [s["configMap"] for s in sources if "configMap" in s]
    ns = [s["downwardAPI"] for s in sources if "downwardAPI" in s]
    assert token and token[0]["path"] == "token"
    assert ca and ca[0]["name"] == "kube-root-ca.crt" and ca[0]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert ns and ns[0]["items"][0] == {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
    for c in spec["containers"]:
        assert all(m["name"] != mount["name"] for m in c.get("volumeMounts", [])), f"{c['name']} must not get the token"

    rules = rules_for(llm_d, spec["serviceAccountName"])
    group = pool["apiVersion"].split("/")[0]
    assert allowed(rules, group, "inferencepools", {"list", "watch"})
    assert allowed(rules, "", "pods", {"list", "watch"})
    assert not any(set(r["verbs"]) - {"get", "list", "watch"} for r in rules), "read-only"


def test_llm_d_epp_wiring(llm_d):
    (pool,) = of_kind(llm_d, "InferencePool")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service"
    service = named(llm_d, "Service", ref["name"])
    (epp,) = [d for d in of_kind(llm_d, "Deployment") if selects(service["spec"]["selector"], pod_labels(d))]
    c = epp["spec"]["template"]["spec"]["containers"][0]
    args = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "true") for a in c["args"])
    assert args["pool-name"] == pool["metadata"]["name"]
    assert args["pool-group"] == pool["apiVersion"].split("/")[0]
    assert env_map(c)["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    (ext_proc,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert resolves_to_a_port(ext_proc["targetPort"], epp)
    assert port_numbers(epp)[ext_proc["targetPort"]] == int(args["grpc-port"])
    health = int(args["grpc-health-port"])
    assert c["livenessProbe"]["grpc"]["port"] == c["readinessProbe"]["grpc"]["port"] == health

    # Its token and RBAC: the pool, its pods, and leases for leader election.
    spec = pod_spec(epp)
    assert spec["automountServiceAccountToken"] is True
    rules = rules_for(llm_d, spec["serviceAccountName"])
    assert allowed(rules, "inference.networking.k8s.io", "inferencepools", {"get", "list", "watch"})
    assert allowed(rules, "", "pods", {"get", "list", "watch"})
    if args.get("ha-enable-leader-election") == "true":
        assert epp["spec"]["replicas"] >= 2
        assert allowed(rules, "coordination.k8s.io", "leases", {"get", "create", "update"})

    # Its configuration: mounted where --config-file points, with the P/D profiles.
    config_path = Path(args["config-file"])
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    config = yaml.safe_load(named(llm_d, "ConfigMap", volume["configMap"]["name"])["data"][config_path.name])
    assert config["kind"] == "EndpointPickerConfig"
    plugins = {p.get("name", p["type"]) for p in config["plugins"]}
    profiles = {p["name"]: [r["pluginRef"] for r in p["plugins"]] for p in config["schedulingProfiles"]}
    assert {"prefill", "decode"} <= set(profiles)
    assert all(ref in plugins for refs in profiles.values() for ref in refs)
    assert "prefill-filter" in profiles["prefill"] and "decode-filter" in profiles["decode"]
    parsers = [p["pluginRef"] for p in config.get("requestHandler", {}).get("parsers", [])]
    assert not parsers or any("vllmhttp" in p for p in parsers), "/inference/v1/generate needs vllmhttp-parser"
