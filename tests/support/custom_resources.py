"""Schema validation of rendered manifests: Kubernetes kinds against the JSON schemas kubernetes-validate
bundles (strict: an unknown field is an error), custom resources by hand-written structural checks of
every field these manifests use, since they have no bundled schema: `InferencePool`, `PodMonitor`,
`PrometheusRule`, `ServiceMonitor` and `ScaledObject`. Any other kind without a schema is an error."""

from __future__ import annotations

import re

import kubernetes_validate  # the `test` extra; bundles the schemas


# The oldest Kubernetes the manifests target (native sidecars are on by default from 1.29), and
# the newest schema set bundled.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


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


def _monitor_endpoints(c: _Checker, obj: dict, key: str, target_labels: set[str]) -> list | None:
    """A Pod- or ServiceMonitor's envelope, spec and selector, checked; its endpoint list (under
    `key`), or None where the spec or the list is unusable (the errors say why)."""
    c.keys(obj, "<root>", {"apiVersion", "kind", "metadata", "spec"}, {"metadata", "spec"})
    c.metadata(obj)
    spec = obj.get("spec")
    allowed = {"selector", key, "namespaceSelector", "jobLabel", "sampleLimit", "targetLimit", "labelLimit",
               "attachMetadata", *target_labels}
    if not c.keys(spec, "spec", allowed, {"selector", key}):
        return None
    if c.keys(spec["selector"], "spec.selector", {"matchLabels", "matchExpressions"}) and "matchLabels" in spec["selector"]:
        c.match_labels(spec["selector"]["matchLabels"], "spec.selector.matchLabels")
    endpoints = spec[key]
    if not isinstance(endpoints, list) or not endpoints:
        c.errors.append(f"spec.{key}: expected a non-empty list")
        return None
    return endpoints


def check_pod_monitor(obj: dict) -> list[str]:
    """PodMonitor, monitoring.coreos.com/v1 (Prometheus Operator): the fields used, checked strictly."""
    c = _Checker()
    endpoints = _monitor_endpoints(c, obj, "podMetricsEndpoints", {"podTargetLabels"})
    if endpoints is None:
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
    endpoints = _monitor_endpoints(c, obj, "endpoints", {"targetLabels", "podTargetLabels"})
    if endpoints is None:
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
