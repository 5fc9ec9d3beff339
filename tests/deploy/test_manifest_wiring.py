"""The manifests' wiring: labels and selectors, probes, drain and security, QoS, scratch volumes,
rollouts, monitors and autoscalers per pool, and the base's and overlays' defaults. Starts no engine."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from tests.support.deploy_render import (
    BASE, COMPOSITIONS, CPU_DEMO, LLM_D, MONITORING, OBSERVABILITY, all_containers, Composition,
    kustomize_cmd, load_docs, named, of_kind, pod_labels, pod_spec, port_numbers, render, selects, tree_id,
)
from tests.support.manifests import (
    PARSER_FLAGS, PART_OF, POOL_TREES, SA_TOKEN_DIR, SHUTDOWN_TIMEOUT_FLAG, TEARDOWN_MARGIN_S, TREES, env_map,
    expand, flag_value, pre_stop_seconds, probe_port, quantity, resolves_to_a_port, server_container,
    server_deployments,
)

# ---------------------------------------------------------------- wiring


@pytest.mark.parametrize("directory", TREES, ids=tree_id)
def test_labels_and_selectors_line_up(directory):
    docs = render(directory)
    deployments = of_kind(docs, "Deployment")
    assert deployments or directory == OBSERVABILITY
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        assert labels.get(PART_OF) == "decode-server", f"{doc['kind']}/{doc['metadata']['name']} labels {labels}"
    for d in deployments:
        assert selects(d["spec"]["selector"]["matchLabels"], pod_labels(d))
        assert d["metadata"]["labels"] == pod_labels(d)
        for spread in pod_spec(d).get("topologySpreadConstraints", []):
            assert selects(spread["labelSelector"]["matchLabels"], pod_labels(d)), "a spread constraint must count the pool's own pods"
        # Pods of one Deployment are selected by no other Deployment.
        others = [o for o in deployments if o is not d and selects(o["spec"]["selector"]["matchLabels"], pod_labels(d))]
        assert not others, f"Deployment/{d['metadata']['name']}'s pods are also selected by {[o['metadata']['name'] for o in others]}"

    def matched(selector):
        return [d for d in deployments if selects(selector, pod_labels(d))]

    for svc in of_kind(docs, "Service"):
        (target,) = matched(svc["spec"]["selector"]) or [None]
        assert target is not None, f"Service/{svc['metadata']['name']} selects no Deployment"
        assert len(matched(svc["spec"]["selector"])) == 1, f"Service/{svc['metadata']['name']} selects several Deployments"
        for port in svc["spec"]["ports"]:
            assert resolves_to_a_port(port["targetPort"], target), f"Service/{svc['metadata']['name']} targetPort {port['targetPort']}"
    for pdb in of_kind(docs, "PodDisruptionBudget"):
        assert len(matched(pdb["spec"]["selector"]["matchLabels"])) == 1, f"PDB/{pdb['metadata']['name']}"
    for d in deployments:
        pdbs = [p for p in of_kind(docs, "PodDisruptionBudget") if selects(p["spec"]["selector"]["matchLabels"], pod_labels(d))]
        assert len(pdbs) == 1, f"Deployment/{d['metadata']['name']} has {len(pdbs)} PDBs"
    for monitor in of_kind(docs, "PodMonitor"):
        pods = matched(monitor["spec"]["selector"]["matchLabels"])
        assert {d["metadata"]["name"] for d in pods} == {d["metadata"]["name"] for d in server_deployments(docs)}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            for d in pods:
                assert endpoint["port"] in port_numbers(d), f"PodMonitor port {endpoint['port']} not on Deployment/{d['metadata']['name']}"
    for monitor in of_kind(docs, "ServiceMonitor"):
        services = [s for s in of_kind(docs, "Service") if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
        assert len(services) == 1, f"ServiceMonitor/{monitor['metadata']['name']} selects {len(services)} Services"
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in {p.get("name") for p in services[0]["spec"]["ports"]}, \
                f"ServiceMonitor port {endpoint['port']} not on Service/{services[0]['metadata']['name']}"
    for pool in of_kind(docs, "InferencePool"):
        assert {d["metadata"]["name"] for d in matched(pool["spec"]["selector"]["matchLabels"])} == {
            d["metadata"]["name"] for d in server_deployments(docs)
        }
    for scaler in autoscalers(docs):
        ref = scaler["spec"]["scaleTargetRef"]
        assert (ref.get("apiVersion", "apps/v1"), ref.get("kind", "Deployment")) == ("apps/v1", "Deployment")
        named(docs, "Deployment", ref["name"])


def autoscalers(docs: list[dict]) -> list[dict]:
    """HorizontalPodAutoscalers and KEDA ScaledObjects (which make one)."""
    return [*of_kind(docs, "HorizontalPodAutoscaler"), *of_kind(docs, "ScaledObject")]


def replica_bounds(docs: list[dict], deployment: dict) -> tuple[int, int]:
    """(min, max) replicas: the Deployment's own count, or its autoscaler's range."""
    name = deployment["metadata"]["name"]
    scalers = [a for a in autoscalers(docs) if a["spec"]["scaleTargetRef"]["name"] == name]
    assert len(scalers) <= 1, f"Deployment/{name} has {len(scalers)} autoscalers"
    if not scalers:
        return deployment["spec"]["replicas"], deployment["spec"]["replicas"]
    spec = scalers[0]["spec"]
    if scalers[0]["kind"] == "ScaledObject":
        return spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    return spec.get("minReplicas", 1), spec["maxReplicas"]


@pytest.mark.parametrize("directory", POOL_TREES, ids=tree_id)
def test_probes_drain_and_security(directory):
    for d in server_deployments(render(directory)):
        pod = pod_spec(d)
        c = server_container(d)
        argv = expand(c)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert int(flag_value(argv, "--port")) == ports["http"], "the server's own port is named http"
        assert flag_value(argv, "--host") == "0.0.0.0"

        assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        assert c["startupProbe"]["httpGet"]["path"] == "/health"
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert probe_port(c, c[probe]) == ports["http"], f"{probe} must hit the server itself"
        assert c["readinessProbe"]["failureThreshold"] == 3

        # SIGTERM comes after preStop; the drain (--shutdown-timeout), then teardown, must end
        # inside the grace period or the kubelet SIGKILLs a pod still finishing requests.
        assert "--drain-timeout" not in argv, "use vLLM's --shutdown-timeout"
        shutdown = int(flag_value(argv, SHUTDOWN_TIMEOUT_FLAG))
        pre_stop = pre_stop_seconds(c)
        grace = pod["terminationGracePeriodSeconds"]
        assert 0 < pre_stop < 30 and shutdown > 0
        assert pre_stop + shutdown < grace, f"preStop {pre_stop}s + --shutdown-timeout {shutdown}s >= grace {grace}s"
        assert pre_stop + shutdown + TEARDOWN_MARGIN_S <= grace, (
            f"grace {grace}s leaves less than {TEARDOWN_MARGIN_S}s after preStop {pre_stop}s + drain {shutdown}s"
        )

        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for container in all_containers(d):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, container["name"]
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], container["name"]
        if c["securityContext"].get("readOnlyRootFilesystem"):
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert {"/home/app", "/tmp"} <= mounts, "a read-only root needs a writable $HOME (caches) and /tmp"
        # No API token for the model server, whatever the pod's other containers get.
        assert pod.get("automountServiceAccountToken") is False
        assert all(m["mountPath"] != SA_TOKEN_DIR for m in c["volumeMounts"])

        api_key = env_map(c)["DECODE_SERVER_API_KEY"]["valueFrom"]["secretKeyRef"]
        assert api_key["optional"] is True


@pytest.mark.parametrize("directory", POOL_TREES, ids=tree_id)
def test_guaranteed_qos(directory):
    """Every container of every pod (sidecars included): requests == limits for CPU and memory, whole
    CPUs. That makes the pods Guaranteed (last to be evicted, exclusive cores under the static CPU
    manager); extended resources (GPUs) are requests == limits by rule."""
    for d in of_kind(render(directory), "Deployment"):
        for c in all_containers(d):
            what = f"Deployment/{d['metadata']['name']} container {c['name']}"
            req, lim = c["resources"]["requests"], c["resources"]["limits"]
            for resource in ("cpu", "memory"):
                assert resource in req and resource in lim, f"{what}: {resource} request and limit"
                assert quantity(req[resource]) == quantity(lim[resource]), f"{what}: {resource} request != limit"
            assert quantity(req["cpu"]).denominator == 1, f"{what}: whole CPUs"
            for resource in set(req) | set(lim):
                if "/" in resource:  # e.g. nvidia.com/gpu
                    assert req.get(resource) == lim.get(resource), f"{what}: {resource}"


@pytest.mark.parametrize("directory", POOL_TREES, ids=tree_id)
def test_scratch_volumes_are_bounded_and_requested(directory):
    """The server's emptyDirs (downloaded weights and caches in $HOME, /tmp) have size limits, and
    the pod requests that much ephemeral storage, so the scheduler reserves it on the node instead
    of the kubelet evicting the pod once the disk fills; /dev/shm (memory) fits the memory limit."""
    for d in server_deployments(render(directory)):
        c = server_container(d)
        disk, memory = Fraction(0), Fraction(0)
        mounted = {m["name"] for m in c["volumeMounts"]}
        for volume in pod_spec(d)["volumes"]:
            if "emptyDir" not in volume or volume["name"] not in mounted:
                continue
            size = volume["emptyDir"].get("sizeLimit")
            assert size, f"emptyDir {volume['name']} has no sizeLimit"
            if volume["emptyDir"].get("medium") == "Memory":
                memory += quantity(size)
            else:
                disk += quantity(size)
        requested = sum(quantity(x["resources"]["requests"].get("ephemeral-storage", 0)) for x in all_containers(d))
        assert disk > 0 and requested >= disk, f"{d['metadata']['name']}: emptyDirs {disk} > ephemeral-storage requests {requested}"
        assert quantity(c["resources"]["limits"]["ephemeral-storage"]) >= quantity(c["resources"]["requests"]["ephemeral-storage"])
        assert memory < quantity(c["resources"]["limits"]["memory"])


@pytest.mark.parametrize("directory", POOL_TREES, ids=tree_id)
def test_rollouts_and_drains_can_proceed(directory):
    """A rollout always makes progress without taking a pool to zero (when it has two pods), and
    each PDB allows at least one eviction at the rendered replica count, so node drains proceed."""
    docs = render(directory)
    for d in of_kind(docs, "Deployment"):
        replicas, _ = replica_bounds(docs, d)
        rolling = d["spec"]["strategy"]["rollingUpdate"]
        surge, unavailable = rolling["maxSurge"], rolling["maxUnavailable"]
        assert isinstance(surge, int) and isinstance(unavailable, int), "absolute numbers, not percentages"
        assert surge + unavailable >= 1
        if replicas >= 2:
            assert unavailable < replicas
        (pdb,) = [p for p in of_kind(docs, "PodDisruptionBudget") if selects(p["spec"]["selector"]["matchLabels"], pod_labels(d))]
        spec = pdb["spec"]
        allowed = spec["maxUnavailable"] if "maxUnavailable" in spec else replicas - spec["minAvailable"]
        assert isinstance(allowed, int) and allowed >= 1, f"PDB/{pdb['metadata']['name']} blocks every eviction"
        assert spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow", "a pod stuck unready must not block drains"


def meta_label(pod_label: str) -> str:
    """The Kubernetes service-discovery label Prometheus gives a pod label."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def pool_label_source(monitor: dict) -> tuple[str, str]:
    """(target label, pod label) of the PodMonitor's pool relabeling."""
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (pool,) = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "pool"]
    assert pool.get("action", "replace") == "replace" and len(pool["sourceLabels"]) == 1
    (source,) = pool["sourceLabels"]
    pod_label = "llm-d.ai/role"
    assert source == meta_label(pod_label), f"pool comes from {source}, not the pod label {pod_label}"
    return pool["targetLabel"], pod_label


MONITORED = [LLM_D, Composition(BASE, MONITORING), Composition(CPU_DEMO, MONITORING)]


@pytest.mark.parametrize("directory", MONITORED, ids=tree_id)
def test_pod_monitor_labels_each_pool(directory):
    """Every scraped series gets job="decode-server" and pool=decode|prefill (a target label from the
    pod's llm-d.ai/role), so rules tell the pools apart without matching pod names. Only target
    labels are added: no metricRelabelings, nothing renamed (llm-d's EPP reads the pods' own
    /metrics, not Prometheus, but the series stay as vLLM names them either way)."""
    docs = render(directory)
    (monitor,) = of_kind(docs, "PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert "metricRelabelings" not in endpoint
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert targets == {"job", "pool"}, targets
    (job,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    assert "sourceLabels" not in job and job["replacement"] == "decode-server"
    _, pod_label = pool_label_source(monitor)
    pools = {d["metadata"]["name"]: pod_labels(d).get(pod_label) for d in server_deployments(docs)}
    expected = {"decode-server-decode": "decode", "decode-server-prefill": "prefill"}
    assert pools == {k: v for k, v in expected.items() if k in pools} and "decode-server-decode" in pools, pools


AUTOSCALER_KINDS = {"HorizontalPodAutoscaler", "ScaledObject"}


def component_kinds(component: Path) -> set[str]:
    """The kinds of the objects a component adds (its `resources` files, as written)."""
    kust = yaml.safe_load((component / "kustomization.yaml").read_text())
    return {d["kind"] for entry in kust.get("resources", []) for d in load_docs((component / entry).read_text())}


@pytest.mark.parametrize("tree", COMPOSITIONS, ids=tree_id)
def test_autoscalers_own_their_pools(tree):
    """With an autoscaling component, one autoscaler owns the decode pool's replicas (KEDA's
    component the prefill pool's too): a scaled Deployment sets none (an apply would reset the pool
    to it), at least the base's two pods stay (the PDB lets one go at a time), and the pool scales in
    one pod per policy period, each period at least a pod's grace period, so a pod drains before the
    next goes. A pool without an autoscaler keeps its two replicas. A component that adds no
    autoscaler leaves every Deployment's replicas as the overlay sets them, and no autoscaler appears."""
    docs = render(tree)
    if not component_kinds(tree.component) & AUTOSCALER_KINDS:
        assert autoscalers(docs) == []
        overlay = {d["metadata"]["name"]: d["spec"].get("replicas") for d in of_kind(render(tree.overlay), "Deployment")}
        rendered = {d["metadata"]["name"]: d["spec"].get("replicas") for d in of_kind(docs, "Deployment")}
        assert {name: rendered[name] for name in overlay} == overlay
        return
    scaled = {a["spec"]["scaleTargetRef"]["name"]: a for a in autoscalers(docs)}
    assert len(scaled) == len(autoscalers(docs)), "one autoscaler per pool"
    assert "decode-server-decode" in scaled
    if "ScaledObject" in component_kinds(tree.component):
        assert set(scaled) == {"decode-server-decode", "decode-server-prefill"}, "KEDA scales both pools"
    for pool in server_deployments(docs):
        name = pool["metadata"]["name"]
        if name not in scaled:
            assert pool["spec"]["replicas"] == 2, f"{name} is not scaled here"
            continue
        assert "replicas" not in pool["spec"], f"the autoscaler owns {name}'s replicas"
        low, high = replica_bounds(docs, pool)
        assert 2 <= low < high
        scaler = scaled[name]
        spec = scaler["spec"]
        behavior = spec["behavior"] if scaler["kind"] == "HorizontalPodAutoscaler" else spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        grace = pod_spec(pool)["terminationGracePeriodSeconds"]
        for policy in behavior["scaleDown"]["policies"]:
            assert policy["type"] == "Pods" and policy["value"] == 1 and policy["periodSeconds"] >= grace, policy
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= grace


def test_base_ha_defaults():
    docs = render(Composition(BASE, MONITORING))
    for d in server_deployments(docs):
        assert d["spec"]["replicas"] == 2
        assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}, "no spare GPU to surge into"
    (monitor,) = of_kind(docs, "PodMonitor")
    assert [(e["port"], e["path"]) for e in monitor["spec"]["podMetricsEndpoints"]] == [("http", "/metrics")]


def test_base_pools():
    docs = render(BASE)
    decode = named(docs, "Deployment", "decode-server-decode")
    prefill = named(docs, "Deployment", "decode-server-prefill")
    assert {d["metadata"]["name"] for d in of_kind(docs, "Deployment")} == {"decode-server-decode", "decode-server-prefill"}
    named(docs, "Service", "decode-server-decode")
    named(docs, "Service", "decode-server-prefill")

    roles = {}
    for d in (decode, prefill):
        c = server_container(d)
        argv = expand(c)
        assert argv[:2] == ["decode-server", "serve"]
        assert not argv[2].startswith("-") and "$(" not in argv[2], f"model argument missing: {argv}"
        kv = json.loads(flag_value(argv, "--kv-transfer-config"))
        assert kv["kv_connector"] == "NixlConnector"
        roles[d["metadata"]["name"]] = kv["kv_role"]

        env = env_map(c)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        nixl_port = int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"])
        assert nixl_port == 5600
        assert {p["name"]: p["containerPort"] for p in c["ports"]}["nixl"] == nixl_port

        res = c["resources"]
        assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "1"

    assert roles == {"decode-server-decode": "kv_consumer", "decode-server-prefill": "kv_producer"}
    decode_argv, prefill_argv = expand(server_container(decode)), expand(server_container(prefill))
    assert "--tokens-only" in prefill_argv and "--tokens-only" not in decode_argv
    assert " ".join(PARSER_FLAGS) in " ".join(decode_argv)
    assert not {"--reasoning-parser", "--tool-call-parser"} & set(prefill_argv)
    # Both pools serve the same model, or the KV handed over is meaningless.
    assert decode_argv[2] == prefill_argv[2]
    assert pod_labels(decode)["llm-d.ai/role"] == "decode" and pod_labels(prefill)["llm-d.ai/role"] == "prefill"


def test_cpu_demo_overlay():
    if kustomize_cmd() is None:
        pytest.skip("no kustomize or kubectl")
    docs = render(CPU_DEMO)
    # No Prometheus Operator objects unless asked for (an apply on a cluster without their CRDs fails).
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}
    monitored = render(Composition(CPU_DEMO, MONITORING))
    assert {d["kind"] for d in monitored} - {d["kind"] for d in docs} == {"PodMonitor", "PrometheusRule"}
    (deployment,) = of_kind(docs, "Deployment")
    c = server_container(deployment)
    argv = expand(c)
    assert argv[2].startswith("-"), f"no MODEL argument, so the server serves its demo model: {argv}"
    assert "--kv-transfer-config" not in argv and "--tokens-only" not in argv
    assert " ".join(PARSER_FLAGS) in " ".join(argv)
    assert not any("nvidia.com/gpu" in r for r in c["resources"].values())
    assert "cpu" in c["image"]
    assert not {"MODEL", "VLLM_NIXL_SIDE_CHANNEL_HOST"} & set(env_map(c))
