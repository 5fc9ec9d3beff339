"""The Kubernetes manifests under deploy/: rendered, schema-validated offline, and checked for the
things the server relies on (probes, drain, pool flags, HA, llm-d wiring). Starts no engine.

Rendering (tests/support/deploy_render.py) uses kustomize (`kustomize build`, else `kubectl kustomize`).
Without either, a kustomization that only lists `resources` (and unhashed generated ConfigMaps) is
assembled by hand (deploy/observability is kept that way on purpose) and one that needs
kustomize's transformers (the base with its model component, the overlays, the components) is
skipped. Each opt-in component under deploy/components/ is rendered on top of the base and of the
llm-d overlay.

Validation uses kubernetes-validate, which bundles the Kubernetes JSON schemas in its wheel, so
nothing is fetched. Strict schemas: an unknown or misspelt field is an error, not ignored.

Custom resources have no bundled schema. The ones used here are validated structurally instead,
by hand-written checks of every field these manifests use (unknown fields are errors there too):
`InferencePool` (inference.networking.k8s.io/v1, Gateway API Inference Extension), `PodMonitor`
and `PrometheusRule` (monitoring.coreos.com/v1, Prometheus Operator) and `ScaledObject`
(keda.sh/v1alpha1, KEDA). Any other kind without a schema fails the test. The PromQL inside the
rules, the dashboard and the autoscalers is checked in tests/deploy/test_observability.py; who may reach
which pod port under the NetworkPolicies, in tests/deploy/test_network_policy.py.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import kubernetes_validate  # the `test` extra; bundles the schemas
import pytest
import yaml

from tests.support.deploy_render import (
    BASE, COMPONENTS, COMPOSITIONS, CPU_DEMO, Composition, DEPLOY, KUSTOMIZATIONS, LLM_D, MONITORING, OBSERVABILITY,
    all_containers, kustomize_cmd, load_docs, named, of_kind, pod_labels, pod_spec, port_numbers, render,
    render_by_hand_applied, render_with_kustomize, selects, tree_id,
)


# The oldest Kubernetes the manifests target (native sidecars are on by default from 1.29), and
# the newest schema set bundled.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())

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


# ---------------------------------------------------------------- custom resources, structurally

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")


class _Checker:
    def __init__(self):
        self.errors: list[str] = []

    def keys(self, obj, where: str, allowed: set[str], required: set[str] = frozenset()) -> bool:
        if not isinstance(obj, dict):
            self.errors.append(f"{where}: expected an object, got {type(obj).__name__}")
            return False
        for k in sorted(set(obj) - allowed):
            self.errors.append(f"{where}.{k}: unknown field")
        missing = sorted(required - set(obj))
        for k in missing:
            self.errors.append(f"{where}.{k}: required")
        return not missing  # go on into the object only when what it needs is there

    def check(self, ok: bool, message: str):
        if not ok:
            self.errors.append(message)

    def string(self, value, where: str, pattern: re.Pattern | None = None, max_len: int = 253):
        if not isinstance(value, str) or not value or len(value) > max_len:
            self.errors.append(f"{where}: expected a non-empty string of at most {max_len} characters")
        elif pattern is not None and not pattern.match(value):
            self.errors.append(f"{where}: {value!r} does not match {pattern.pattern}")

    def port_number(self, value, where: str):
        self.check(isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535,
                   f"{where}: expected a port number 1-65535, got {value!r}")

    def match_labels(self, value, where: str):
        if not isinstance(value, dict) or not value:
            self.errors.append(f"{where}: expected a non-empty map of labels")
            return
        for k, v in value.items():
            self.check(isinstance(k, str) and bool(_LABEL_KEY.match(k)), f"{where}: bad label key {k!r}")
            self.check(isinstance(v, str) and len(v) <= 63 and bool(_LABEL_VALUE.match(v)), f"{where}.{k}: bad label value {v!r}")

    def metadata(self, obj: dict):
        meta = obj.get("metadata")
        if self.keys(meta, "metadata", {"name", "namespace", "labels", "annotations"}, {"name"}):
            self.string(meta["name"], "metadata.name", _DNS_NAME)
            if "labels" in meta:
                self.match_labels(meta["labels"], "metadata.labels")


def check_inference_pool(obj: dict) -> list[str]:
    """InferencePool, inference.networking.k8s.io/v1 (the GA API llm-d-router's EPP and sidecar watch)."""
    c = _Checker()
    c.keys(obj, "<root>", {"apiVersion", "kind", "metadata", "spec"}, {"metadata", "spec"})
    c.metadata(obj)
    spec = obj.get("spec")
    if not c.keys(spec, "spec", {"selector", "targetPorts", "endpointPickerRef", "appProtocol"},
                  {"selector", "targetPorts", "endpointPickerRef"}):
        return c.errors
    if c.keys(spec["selector"], "spec.selector", {"matchLabels"}, {"matchLabels"}):
        c.match_labels(spec["selector"]["matchLabels"], "spec.selector.matchLabels")
    ports = spec["targetPorts"]
    if not isinstance(ports, list) or not 1 <= len(ports) <= 8:
        c.errors.append("spec.targetPorts: expected a list of 1 to 8 ports")
    else:
        for i, p in enumerate(ports):
            if c.keys(p, f"spec.targetPorts[{i}]", {"number"}, {"number"}):
                c.port_number(p["number"], f"spec.targetPorts[{i}].number")
        numbers = [p.get("number") for p in ports if isinstance(p, dict)]
        c.check(len(numbers) == len(set(numbers)), "spec.targetPorts: duplicate port numbers")
    if "appProtocol" in spec:
        c.check(spec["appProtocol"] in ("http", "kubernetes.io/h2c"), f"spec.appProtocol: {spec['appProtocol']!r}")
    ref = spec["endpointPickerRef"]
    if c.keys(ref, "spec.endpointPickerRef", {"group", "kind", "name", "port", "failureMode"}, {"name"}):
        c.string(ref["name"], "spec.endpointPickerRef.name", _DNS_NAME)
        kind = ref.get("kind", "Service")
        c.check(isinstance(kind, str) and bool(re.match(r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$", kind)),
                f"spec.endpointPickerRef.kind: {kind!r}")
        if "group" in ref:
            c.check(isinstance(ref["group"], str) and (ref["group"] == "" or bool(_DNS_NAME.match(ref["group"]))),
                    f"spec.endpointPickerRef.group: {ref['group']!r}")
        if kind == "Service":
            c.check("port" in ref, "spec.endpointPickerRef.port: required when kind is Service")
        if "port" in ref and c.keys(ref["port"], "spec.endpointPickerRef.port", {"number"}, {"number"}):
            c.port_number(ref["port"]["number"], "spec.endpointPickerRef.port.number")
        if "failureMode" in ref:
            c.check(ref["failureMode"] in ("FailOpen", "FailClose"), f"spec.endpointPickerRef.failureMode: {ref['failureMode']!r}")
    return c.errors


_POD_METRICS_ENDPOINT_FIELDS = {
    "port", "portNumber", "targetPort", "path", "scheme", "params", "interval", "scrapeTimeout",
    "honorLabels", "honorTimestamps", "trackTimestampsStaleness", "relabelings", "metricRelabelings",
    "filterRunning", "enableHttp2", "followRedirects", "proxyUrl", "authorization", "basicAuth",
    "oauth2", "tlsConfig", "bearerTokenSecret",
}


def check_pod_monitor(obj: dict) -> list[str]:
    """PodMonitor, monitoring.coreos.com/v1 (Prometheus Operator): the fields used, checked strictly."""
    c = _Checker()
    c.keys(obj, "<root>", {"apiVersion", "kind", "metadata", "spec"}, {"metadata", "spec"})
    c.metadata(obj)
    spec = obj.get("spec")
    allowed = {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel", "podTargetLabels",
               "sampleLimit", "targetLimit", "labelLimit", "attachMetadata"}
    if not c.keys(spec, "spec", allowed, {"selector", "podMetricsEndpoints"}):
        return c.errors
    if c.keys(spec["selector"], "spec.selector", {"matchLabels", "matchExpressions"}):
        if "matchLabels" in spec["selector"]:
            c.match_labels(spec["selector"]["matchLabels"], "spec.selector.matchLabels")
    endpoints = spec["podMetricsEndpoints"]
    if not isinstance(endpoints, list) or not endpoints:
        c.errors.append("spec.podMetricsEndpoints: expected a non-empty list")
        return c.errors
    for i, ep in enumerate(endpoints):
        where = f"spec.podMetricsEndpoints[{i}]"
        if not c.keys(ep, where, _POD_METRICS_ENDPOINT_FIELDS):
            continue
        c.check("port" in ep or "portNumber" in ep, f"{where}: needs port (a container port name) or portNumber")
        if "port" in ep:
            c.string(ep["port"], f"{where}.port", re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), 15)
        if "portNumber" in ep:
            c.port_number(ep["portNumber"], f"{where}.portNumber")
        if "path" in ep:
            c.check(isinstance(ep["path"], str) and ep["path"].startswith("/"), f"{where}.path: {ep['path']!r}")
        for key in ("interval", "scrapeTimeout"):
            if key in ep:
                c.check(isinstance(ep[key], str) and bool(_DURATION.match(ep[key])), f"{where}.{key}: {ep[key]!r}")
        if "scheme" in ep:
            c.check(ep["scheme"] in ("http", "https", "HTTP", "HTTPS"), f"{where}.scheme: {ep['scheme']!r}")
        for j, relabel in enumerate(ep.get("relabelings", [])):
            _check_relabeling(c, relabel, f"{where}.relabelings[{j}]")
    return c.errors


_PROM_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# The Prometheus Operator's RelabelConfig (actions are case-insensitive there).
_RELABEL_ACTIONS = {"replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase",
                    "uppercase", "keepequal", "dropequal"}


def _check_relabeling(c: "_Checker", relabel, where: str):
    if not c.keys(relabel, where, {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}):
        return
    action = str(relabel.get("action", "replace")).lower()
    c.check(action in _RELABEL_ACTIONS, f"{where}.action: {relabel.get('action')!r}")
    sources = relabel.get("sourceLabels", [])
    c.check(isinstance(sources, list) and all(isinstance(x, str) and _PROM_LABEL.match(x) for x in sources),
            f"{where}.sourceLabels: {sources!r}")
    if action in ("replace", "hashmod", "lowercase", "uppercase", "keepequal", "dropequal"):
        c.check("targetLabel" in relabel, f"{where}.targetLabel: required for action {action}")
    if "targetLabel" in relabel:
        c.check(isinstance(relabel["targetLabel"], str) and bool(_PROM_LABEL.match(relabel["targetLabel"])),
                f"{where}.targetLabel: {relabel['targetLabel']!r}")
    if "regex" in relabel:
        try:
            re.compile(relabel["regex"])
        except (re.error, TypeError) as e:
            c.errors.append(f"{where}.regex: {e}")


def check_prometheus_rule(obj: dict) -> list[str]:
    """PrometheusRule, monitoring.coreos.com/v1: groups of alerting and recording rules. The
    expressions themselves are parsed by promtool in tests/deploy/test_observability.py."""
    c = _Checker()
    c.keys(obj, "<root>", {"apiVersion", "kind", "metadata", "spec"}, {"metadata", "spec"})
    c.metadata(obj)
    if not c.keys(obj.get("spec"), "spec", {"groups"}, {"groups"}):
        return c.errors
    groups = obj["spec"]["groups"]
    if not isinstance(groups, list) or not groups:
        return [*c.errors, "spec.groups: expected a non-empty list"]
    names = [g.get("name") for g in groups if isinstance(g, dict)]
    c.check(len(names) == len(set(names)), f"spec.groups: duplicate names {names}")
    for i, group in enumerate(groups):
        where = f"spec.groups[{i}]"
        if not c.keys(group, where, {"name", "interval", "rules", "limit", "partial_response_strategy", "query_offset", "labels"},
                      {"name", "rules"}):
            continue
        c.string(group["name"], f"{where}.name")
        if "interval" in group:
            c.check(isinstance(group["interval"], str) and bool(_DURATION.match(group["interval"])), f"{where}.interval")
        for j, rule in enumerate(group["rules"] or []):
            _check_rule(c, rule, f"{where}.rules[{j}]")
    return c.errors


def _check_rule(c: "_Checker", rule, where: str):
    if not c.keys(rule, where, {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}, {"expr"}):
        return
    c.check(("alert" in rule) != ("record" in rule), f"{where}: exactly one of alert and record")
    name = rule.get("alert", rule.get("record"))
    c.check(isinstance(name, str) and bool(re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$", name or "")), f"{where}: name {name!r}")
    c.check(isinstance(rule["expr"], str) and bool(rule["expr"].strip()), f"{where}.expr: expected a PromQL string")
    for key in ("for", "keep_firing_for"):
        if key in rule:
            c.check(isinstance(rule[key], str) and bool(_DURATION.match(rule[key])), f"{where}.{key}: {rule[key]!r}")
    for key in ("labels", "annotations"):
        value = rule.get(key, {})
        c.check(isinstance(value, dict) and all(isinstance(k, str) and _PROM_LABEL.match(k) and isinstance(v, str)
                                                for k, v in value.items()), f"{where}.{key}: a map of label names to strings")
    c.check("annotations" not in rule or "alert" in rule, f"{where}.annotations: only alerting rules have them")


_KEDA_PROMETHEUS_METADATA = {"serverAddress", "query", "threshold", "activationThreshold", "namespace", "customHeaders",
                             "ignoreNullValues", "queryParameters", "unsafeSsl", "timeout", "authModes"}


def check_scaled_object(obj: dict) -> list[str]:
    """ScaledObject, keda.sh/v1alpha1 (KEDA 2.x), with prometheus triggers. The HPA behavior it
    passes through is validated against the Kubernetes HorizontalPodAutoscaler schema."""
    c = _Checker()
    c.keys(obj, "<root>", {"apiVersion", "kind", "metadata", "spec"}, {"metadata", "spec"})
    c.metadata(obj)
    spec = obj.get("spec")
    allowed = {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "idleReplicaCount",
               "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers"}
    if not c.keys(spec, "spec", allowed, {"scaleTargetRef", "triggers"}):
        return c.errors
    if c.keys(spec["scaleTargetRef"], "spec.scaleTargetRef", {"apiVersion", "kind", "name", "envSourceContainerName"}, {"name"}):
        c.string(spec["scaleTargetRef"]["name"], "spec.scaleTargetRef.name", _DNS_NAME)
    for key in ("pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "idleReplicaCount", "minReplicaCount", "maxReplicaCount"):
        if key in spec:
            c.check(isinstance(spec[key], int) and not isinstance(spec[key], bool) and spec[key] >= 0, f"spec.{key}: {spec[key]!r}")
    if isinstance(spec.get("minReplicaCount"), int) and isinstance(spec.get("maxReplicaCount"), int):
        c.check(spec["minReplicaCount"] <= spec["maxReplicaCount"], "spec.minReplicaCount > spec.maxReplicaCount")
    advanced = spec.get("advanced", {})
    if c.keys(advanced, "spec.advanced", {"restoreToOriginalReplicaCount", "horizontalPodAutoscalerConfig", "scalingModifiers"}):
        hpa_config = advanced.get("horizontalPodAutoscalerConfig", {})
        if c.keys(hpa_config, "spec.advanced.horizontalPodAutoscalerConfig", {"name", "behavior"}) and "behavior" in hpa_config:
            hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "behavior"},
                   "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 1, "behavior": hpa_config["behavior"]}}
            c.errors += [f"spec.advanced.horizontalPodAutoscalerConfig.behavior: {e}" for e in schema_errors([hpa])]
    triggers = spec["triggers"]
    if not isinstance(triggers, list) or not triggers:
        return [*c.errors, "spec.triggers: expected a non-empty list"]
    for i, trigger in enumerate(triggers):
        where = f"spec.triggers[{i}]"
        if not c.keys(trigger, where, {"type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"}, {"type", "metadata"}):
            continue
        c.check(trigger.get("metricType", "AverageValue") in ("AverageValue", "Value", "Utilization"), f"{where}.metricType")
        meta = trigger["metadata"]
        c.check(isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values()), f"{where}.metadata: values are strings")
        if trigger["type"] == "prometheus" and c.keys(meta, f"{where}.metadata", _KEDA_PROMETHEUS_METADATA, {"serverAddress", "query", "threshold"}):
            c.check(bool(re.match(r"^https?://", meta["serverAddress"])), f"{where}.metadata.serverAddress: {meta['serverAddress']!r}")
            c.check(bool(re.match(r"^[0-9]+(\.[0-9]+)?$", meta["threshold"])), f"{where}.metadata.threshold: {meta['threshold']!r}")
            c.check(meta.get("ignoreNullValues", "true") in ("true", "false"), f"{where}.metadata.ignoreNullValues")
    return c.errors


def check_service_monitor(obj: dict) -> list[str]:
    """ServiceMonitor, monitoring.coreos.com/v1: the fields used, checked strictly. Its endpoints
    take a Service port's name (port) or the pods' (targetPort), otherwise a PodMonitor's fields."""
    c = _Checker()
    c.keys(obj, "<root>", {"apiVersion", "kind", "metadata", "spec"}, {"metadata", "spec"})
    c.metadata(obj)
    spec = obj.get("spec")
    allowed = {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels", "podTargetLabels",
               "sampleLimit", "targetLimit", "labelLimit", "attachMetadata"}
    if not c.keys(spec, "spec", allowed, {"selector", "endpoints"}):
        return c.errors
    if c.keys(spec["selector"], "spec.selector", {"matchLabels", "matchExpressions"}) and "matchLabels" in spec["selector"]:
        c.match_labels(spec["selector"]["matchLabels"], "spec.selector.matchLabels")
    endpoints = spec["endpoints"]
    if not isinstance(endpoints, list) or not endpoints:
        c.errors.append("spec.endpoints: expected a non-empty list")
        return c.errors
    for i, ep in enumerate(endpoints):
        where = f"spec.endpoints[{i}]"
        if not c.keys(ep, where, (_POD_METRICS_ENDPOINT_FIELDS - {"portNumber"}) | {"targetPort"}):
            continue
        c.check("port" in ep or "targetPort" in ep, f"{where}: needs port (a Service port name) or targetPort")
        if "port" in ep:
            c.string(ep["port"], f"{where}.port", re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), 15)
        if "path" in ep:
            c.check(isinstance(ep["path"], str) and ep["path"].startswith("/"), f"{where}.path: {ep['path']!r}")
        for key in ("interval", "scrapeTimeout"):
            if key in ep:
                c.check(isinstance(ep[key], str) and bool(_DURATION.match(ep[key])), f"{where}.{key}: {ep[key]!r}")
    return c.errors


CUSTOM_RESOURCES = {
    ("inference.networking.k8s.io/v1", "InferencePool"): check_inference_pool,
    ("monitoring.coreos.com/v1", "PodMonitor"): check_pod_monitor,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): check_service_monitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): check_prometheus_rule,
    ("keda.sh/v1alpha1", "ScaledObject"): check_scaled_object,
}


# ---------------------------------------------------------------- schema validation


def schema_errors(docs: list[dict]) -> list[str]:
    errors = []
    for doc in docs:
        what = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        custom = CUSTOM_RESOURCES.get((doc.get("apiVersion"), doc.get("kind")))
        if custom is not None:
            errors += [f"{what} (structural): {e}" for e in custom(doc)]
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                errors.append(f"{what} (k8s {version}) at {path or '<root>'}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                errors.append(f"{what}: no schema and no structural check: {e.message}")
    return errors


def _copy(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


def test_validator_rejects_a_broken_manifest():
    """The validator is live: a typo'd field and a wrong type are both caught."""
    deployment = named(render(BASE), "Deployment", "decode-server-decode")
    typo = _copy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    wrong_type = _copy(deployment)
    wrong_type["spec"]["replicas"] = "one"
    assert schema_errors([deployment]) == []
    assert schema_errors([typo]) and schema_errors([wrong_type])


def test_structural_checks_reject_broken_custom_resources():
    """The InferencePool and PodMonitor checks are live, and a kind with neither is an error."""
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 8000}],
                 "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}},
    }
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "m"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "podMetricsEndpoints": [{"port": "http", "path": "/metrics"}]},
    }
    assert schema_errors([pool, monitor]) == []
    broken = []
    for mutate in (
        lambda p: p["spec"].update(selector={"app": "x"}),  # the alpha API's flat selector
        lambda p: p["spec"].update(targetPorts=[{"number": 70000}]),
        lambda p: p["spec"].update(targetPorts=[]),
        lambda p: p["spec"]["endpointPickerRef"].update(failureMode="Sometimes"),
        lambda p: p["spec"]["endpointPickerRef"].pop("port"),
        lambda p: p["spec"].update(extensionRef={"name": "epp"}),  # pre-v1 field name
    ):
        p = _copy(pool)
        mutate(p)
        broken.append(schema_errors([p]))
    for mutate in (
        lambda m: m["spec"]["podMetricsEndpoints"][0].update(interval="15 seconds"),
        lambda m: m["spec"]["podMetricsEndpoints"][0].update(paths="/metrics"),
        lambda m: m["spec"].pop("selector"),
    ):
        m = _copy(monitor)
        mutate(m)
        broken.append(schema_errors([m]))
    assert all(broken), broken
    assert schema_errors([{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}])


def test_structural_checks_reject_broken_rules_autoscalers_and_relabelings():
    """The PrometheusRule, ScaledObject and PodMonitor relabeling checks are live."""
    rule = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": {"name": "r"},
        "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0", "for": "5m",
                                                      "labels": {"severity": "warning"}, "annotations": {"summary": "s"}}]}]},
    }
    scaled = {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "s"},
        "spec": {"scaleTargetRef": {"name": "d"}, "minReplicaCount": 2, "maxReplicaCount": 4,
                 "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}}},
                 "triggers": [{"type": "prometheus", "metadata": {"serverAddress": "http://p:9090", "query": "up", "threshold": "4"}}]},
    }
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "m"},
        "spec": {"selector": {"matchLabels": {"a": "b"}},
                 "podMetricsEndpoints": [{"port": "http", "relabelings": [{"sourceLabels": ["__meta_x"], "targetLabel": "pool"}]}]},
    }
    assert schema_errors([rule, scaled, monitor]) == []
    mutations = [
        (rule, lambda r: r["spec"]["groups"][0]["rules"][0].update(record="x")),  # alert and record
        (rule, lambda r: r["spec"]["groups"][0]["rules"][0].update({"for": "five minutes"})),
        (rule, lambda r: r["spec"]["groups"][0]["rules"][0].update(annotation={"summary": "s"})),
        (rule, lambda r: r["spec"]["groups"].append({"name": "g", "rules": []})),  # duplicate group
        (scaled, lambda o: o["spec"].update(minReplicaCount=5)),
        (scaled, lambda o: o["spec"]["triggers"][0]["metadata"].update(threshold="four")),
        (scaled, lambda o: o["spec"]["triggers"][0]["metadata"].pop("query")),
        (scaled, lambda o: o["spec"]["triggers"][0].update(metricType="Average")),
        (scaled, lambda o: o["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"].update(scaleDwn={})),
        (monitor, lambda m: m["spec"]["podMetricsEndpoints"][0]["relabelings"][0].update(action="rename")),
        (monitor, lambda m: m["spec"]["podMetricsEndpoints"][0]["relabelings"][0].update(targetLabel="pool-name")),
        (monitor, lambda m: m["spec"]["podMetricsEndpoints"][0]["relabelings"][0].pop("targetLabel")),
    ]
    broken = []
    for obj, mutate in mutations:
        o = _copy(obj)
        mutate(o)
        broken.append(schema_errors([o]))
    assert all(broken), broken


# Every tree an operator can apply: each kustomization, and each component on the pool overlays.
TREES = [*KUSTOMIZATIONS, *COMPOSITIONS]
# Trees that run the pools (deploy/observability holds only the rule and the dashboard).
POOL_TREES = [t for t in TREES if t != OBSERVABILITY]
# YAML under deploy/ that is not a Kubernetes object: Helm values for prometheus-adapter.
NOT_MANIFESTS = {DEPLOY / "components" / "hpa-autoscaling" / "prometheus-adapter-values.yaml"}


@pytest.mark.parametrize("directory", TREES, ids=tree_id)
def test_renders_and_matches_kubernetes_schemas(directory):
    docs = render(directory)
    assert docs, f"{tree_id(directory)} rendered nothing"
    assert schema_errors(docs) == []


@pytest.mark.parametrize("directory", [*KUSTOMIZATIONS, *COMPONENTS], ids=tree_id)
def test_every_listed_resource_file_is_valid_on_its_own(directory):
    """Each file in `resources` is a whole object (not a fragment) and valid as written."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    for entry in kust.get("resources", []):
        path = directory / entry
        if path.is_dir():
            assert (path / "kustomization.yaml").is_file(), f"{path} is not a kustomization"
            continue
        docs = load_docs(path.read_text())
        assert docs, f"{path} is empty"
        assert schema_errors(docs) == [], path


def test_no_stray_manifest_files():
    """Every YAML or JSON file under deploy/ is a kustomization or component, or used by one (a
    resource, a patch, a generated ConfigMap's file), or one of the listed non-manifests."""
    used = set()
    for directory in [*KUSTOMIZATIONS, *COMPONENTS]:
        kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
        used |= {(directory / r).resolve() for r in kust.get("resources", [])}
        used |= {(directory / p["path"]).resolve() for p in kust.get("patches", []) if "path" in p}
        used |= {(directory / f).resolve() for g in kust.get("configMapGenerator", []) for f in g.get("files", [])}
    files = [*DEPLOY.rglob("*.y*ml"), *DEPLOY.rglob("*.json")]
    stray = [str(p.relative_to(DEPLOY)) for p in files if p.name != "kustomization.yaml" and p.resolve() not in used | NOT_MANIFESTS]
    assert stray == []
    for path in NOT_MANIFESTS:
        assert not {"apiVersion", "kind"} & set(yaml.safe_load(path.read_text())), f"{path} is a manifest: list it in a kustomization"


@pytest.mark.parametrize("directory", [OBSERVABILITY], ids=tree_id)
def test_by_hand_render_matches_kustomize(directory):
    """The no-kustomize fallback renders deploy/observability exactly as kustomize does."""
    if kustomize_cmd() is None:
        pytest.skip("no kustomize or kubectl")

    def key(d):
        return (d["kind"], d["metadata"]["name"])

    assert sorted(render_by_hand_applied(directory), key=key) == sorted(render_with_kustomize(directory), key=key)


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


# ---------------------------------------------------------------- against the server itself


@pytest.fixture(scope="module")
def serve_parser():
    from decode_server.process.cli import build_parser

    return build_parser()


def _all_server_deployments():
    out = []
    for directory in [*KUSTOMIZATIONS, *COMPOSITIONS]:
        if kustomize_cmd() is None:
            continue
        out += [(directory, d) for d in server_deployments(render(directory))]
    return out


@pytest.mark.parametrize(
    "directory,deployment",
    _all_server_deployments(),
    ids=lambda v: tree_id(v) if isinstance(v, (Path, Composition)) else v["metadata"]["name"],
)
def test_server_cli_accepts_the_manifest_args(serve_parser, directory, deployment):
    """The argv each pod runs parses with decode-server's own CLI (vLLM engine flags included)."""
    argv = expand(server_container(deployment))
    assert argv[0] == "decode-server"
    try:
        args = serve_parser.parse_args(argv[1:])
    except SystemExit as e:  # argparse reports on stderr and exits 2
        pytest.fail(f"decode-server rejects {argv[1:]} (exit {e.code}); see captured stderr")
    assert args.command == "serve"
    assert args.host == "0.0.0.0" and args.port == int(flag_value(argv, "--port"))
    assert args.shutdown_timeout == int(flag_value(argv, SHUTDOWN_TIMEOUT_FLAG))
    if "--kv-transfer-config" in argv:
        kv = json.loads(flag_value(argv, "--kv-transfer-config"))
        assert args.kv_transfer_config.kv_connector == "NixlConnector"
        assert args.kv_transfer_config.kv_role == kv["kv_role"]
        if args.tokens_only:
            assert kv["kv_role"] == "kv_producer"
    if "--otlp-traces-endpoint" in argv:  # the tracing component: vLLM's engine tracing, and the server span
        assert args.otlp_traces_endpoint == flag_value(argv, "--otlp-traces-endpoint")


def test_server_serves_the_probed_and_scraped_routes():
    """/ready and /health (the probes) and /metrics (the PodMonitor, the EPP) are routes of the app."""
    from decode_server.http.app import build_app

    try:
        from decode_server.config import ServerConfig
    except ImportError:  # older layout
        from decode_server.generate.service import ServerConfig

    # Built, not started: the engine factory and the lifecycle are only used by the lifespan.
    app = build_app(lambda: None, ServerConfig(served_model_names=("probe",)), None)
    paths = {getattr(r, "path", None) for r in app.routes}
    assert {"/ready", "/health", "/metrics"} <= paths
