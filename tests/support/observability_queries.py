"""Every PromQL query deploy/ ships, and the check that each selects series that exist.

Queries come from the Grafana dashboard (panels and variables; Grafana's $__ intervals and the
dashboard's own variables substituted, the latter only allowed as `=~"$var"` matchers), the
PrometheusRule, the KEDA ScaledObject and the prometheus-adapter rules behind the plain HPA.
`selector_problems` walks a query's syntax tree (promql-parser) and reports each selector whose
metric is not exposed, or whose matchers name a label the series cannot carry or a value it
never takes.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from dataclasses import dataclass

import promql_parser  # the `test` extra
import pytest
import yaml

from tests.support.deploy_render import DEPLOY, OBSERVABILITY

ROOT = DEPLOY.parent
DASHBOARD = OBSERVABILITY / "decode-server-dashboard.json"
RULES = DEPLOY / "components" / "monitoring" / "prometheusrule.yaml"
KEDA = DEPLOY / "components" / "keda-autoscaling" / "scaledobject.yaml"
HPA = DEPLOY / "components" / "hpa-autoscaling" / "hpa.yaml"
ADAPTER = DEPLOY / "components" / "hpa-autoscaling" / "prometheus-adapter-values.yaml"

# What a dashboard time range gives Grafana's built-in interval variables, for parsing.
GRAFANA_BUILTINS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
# Labels the Prometheus Operator puts on every series of a PodMonitor target (the PodMonitor's own
# relabelings add more: tests read those from the manifest).
OPERATOR_TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint"}
# Series the rules read from the cluster, not from a decode-server process, with the labels their
# exporters give them (each also carries its scrape's job and instance): kube-state-metrics'
# (docs/metrics/workload/{pod,deployment,horizontalpodautoscaler}-metrics.md there; the values
# its code sets for the enum-like labels used here) and the kubelet's cAdvisor working set.
_POD = {"namespace", "pod", "uid", "job", "instance"}
_CONTAINER = _POD | {"container"}
_HPA = {"namespace", "horizontalpodautoscaler", "job", "instance"}
KUBE_STATE_METRICS = {
    "kube_pod_deletion_timestamp": {"labels": _POD, "values": {}},
    "kube_pod_status_phase": {"labels": _POD | {"phase"}, "values": {"phase": {"Pending", "Running", "Succeeded", "Failed", "Unknown"}}},
    "kube_pod_container_status_waiting_reason": {"labels": _CONTAINER | {"reason"}, "values": {"reason": {
        "ContainerCreating", "CrashLoopBackOff", "CreateContainerConfigError", "ErrImagePull", "ImagePullBackOff",
        "CreateContainerError", "InvalidImageName"}}},
    "kube_pod_container_status_restarts_total": {"labels": _CONTAINER, "values": {}},
    "kube_pod_container_resource_limits": {"labels": _CONTAINER | {"node", "resource", "unit"}, "values": {
        "resource": {"cpu", "memory", "ephemeral_storage", "nvidia_com_gpu"}}},
    "kube_deployment_status_replicas_available": {"labels": {"namespace", "deployment", "job", "instance"}, "values": {}},
    "kube_deployment_spec_replicas": {"labels": {"namespace", "deployment", "job", "instance"}, "values": {}},
    "kube_horizontalpodautoscaler_status_current_replicas": {"labels": _HPA, "values": {}},
    "kube_horizontalpodautoscaler_spec_max_replicas": {"labels": _HPA, "values": {}},
    "kube_horizontalpodautoscaler_status_condition": {"labels": _HPA | {"condition", "status"}, "values": {
        "condition": {"AbleToScale", "ScalingActive", "ScalingLimited"}, "status": {"true", "false", "unknown"}}},
    # cAdvisor, through the kubelet (kube-prometheus-stack's job "kubelet", path /metrics/cadvisor).
    "container_memory_working_set_bytes": {"labels": {"namespace", "pod", "container", "id", "image", "name", "job", "instance",
                                                      "endpoint", "metrics_path", "node", "service"}, "values": {}},
}


@dataclass(frozen=True)
class Query:
    where: str
    promql: str


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: it ships in Debian's prometheus package (apt-get install -y prometheus); "
                    "`./dev setup test` installs it")
    return path


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def rule_groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["spec"]["groups"]


def alerts() -> list[dict]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


def grafana_to_promql(expr: str, variables: set[str]) -> str:
    """Grafana's built-in intervals become durations; a dashboard variable, used only as a whole
    `=~"$var"` matcher value, becomes its All value `.*`."""
    text = re.sub(r"\$(__\w+)", lambda m: GRAFANA_BUILTINS[m[1]], expr)
    for name in re.findall(r'=~"\$(\w+)"', text):
        assert name in variables, f"undefined dashboard variable ${name} in {expr}"
    text = re.sub(r'=~"\$\w+"', '=~".*"', text)
    assert "$" not in text, f"a dashboard variable used outside a =~\"$var\" matcher: {expr}"
    return text


def label_values_selector(definition: str) -> str:
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", definition)
    assert m, f"not a label_values(selector, label) query: {definition}"
    return m[1]


def dashboard_queries(dash: dict) -> list[Query]:
    variables = {v["name"] for v in dash["templating"]["list"]}
    out = [
        Query(f"panel {p['id']} {p['title']!r} {t['refId']}", grafana_to_promql(t["expr"], variables))
        for p in dash["panels"] for t in p.get("targets", [])
    ]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            selector = label_values_selector(v["definition"])
            out.append(Query(f"variable {v['name']}", grafana_to_promql(selector, variables)))
    return out


def rule_queries() -> list[Query]:
    return [Query(f"rule {r.get('alert', r.get('record'))}", r["expr"]) for g in rule_groups() for r in g["rules"]]


def adapter_queries() -> list[Query]:
    """prometheus-adapter's templates filled as it fills them for one pod of the decode pool."""
    out = []
    for rule in yaml.safe_load(ADAPTER.read_text())["rules"]["custom"]:
        out.append(Query(f"adapter seriesQuery {rule['name']['as']}", rule["seriesQuery"]))
        name = rule["seriesQuery"].split("{")[0]
        filled = (rule["metricsQuery"].replace("<<.Series>>", name).replace("<<.GroupBy>>", "pod")
                  .replace("<<.LabelMatchers>>", 'namespace="default", pod=~"decode-server-decode-.*"'))
        out.append(Query(f"adapter metricsQuery {rule['name']['as']}", filled))
    return out


def keda_scaled_objects() -> list[dict]:
    """The keda-autoscaling component's ScaledObjects (one per pool)."""
    return [d for d in yaml.safe_load_all(KEDA.read_text()) if d]


def keda_queries() -> list[Query]:
    return [Query(f"ScaledObject {s['metadata']['name']} trigger {t['name']}", t["metadata"]["query"])
            for s in keda_scaled_objects() for t in s["spec"]["triggers"]]


def all_queries() -> list[Query]:
    return [*dashboard_queries(load_dashboard()), *rule_queries(), *keda_queries(), *adapter_queries()]


def selectors(promql: str) -> list[promql_parser.VectorSelector]:
    found = []
    promql_parser.walk(promql_parser.parse(promql), pre_visit=lambda n: found.append(n) if isinstance(n, promql_parser.VectorSelector) else None)
    return found


def grouping_labels(promql: str) -> set[str]:
    """Labels named in by (...), on (...) and group_left/right (...)."""
    found: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            found.update(node.modifier.labels)
        if isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            if node.modifier.matching is not None:
                found.update(node.modifier.matching.labels)
            found.update(node.modifier.group_labels or [])

    promql_parser.walk(promql_parser.parse(promql), pre_visit=visit)
    return found


def replaced_labels(promql: str) -> set[str]:
    """The destination labels of the query's label_replace calls."""
    found: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.Call) and node.func.name == "label_replace":
            found.add(node.args[1].val)

    promql_parser.walk(promql_parser.parse(promql), pre_visit=visit)
    return found


def code_label_values() -> dict[str, set[str]]:
    """The reasons (decode_server_rejections_total) and causes (decode_server_aborts_total) the
    server's code can record: strings that flow into a `reason` argument or variable, and first
    arguments of `.aborted(...)`."""
    reasons: set[str] = set()
    causes: set[str] = set()

    def strings(node) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    for path in (ROOT / "decode_server").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "reason":
                reasons |= strings(node.value)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "reason" for t in node.targets):
                reasons |= strings(node.value)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.args[len(node.args.args) - len(node.args.defaults):]
                defaults = [*zip(args, node.args.defaults), *zip(node.args.kwonlyargs, node.args.kw_defaults)]
                reasons |= {s for a, d in defaults if a.arg == "reason" and d is not None for s in strings(d)}
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "aborted" and node.args:
                causes |= strings(node.args[0])
    return {"reason": reasons, "cause": causes}


def _alternatives(regex: str) -> list[str]:
    """A matcher regex's top-level alternatives (the whole regex when it has groups)."""
    return [regex] if "(" in regex else regex.split("|")


def value_problems(label: str, op: promql_parser.MatchOp, value: str, known: set[str]) -> list[str]:
    if op in (promql_parser.MatchOp.Equal, promql_parser.MatchOp.NotEqual):
        return [] if value == "" or value in known else [f"{label}={value!r} is never set (known: {sorted(known)})"]
    problems = []
    for part in _alternatives(value):
        literal = re.escape(part) == part
        if (literal and part not in known) or not any(re.fullmatch(part, k) for k in known):
            problems.append(f"{label}=~{part!r} matches no value it takes (known: {sorted(known)})")
    return problems


def selector_problems(query: Query, exposed: dict[str, dict], target_labels: set[str], target_values: dict[str, set[str]]) -> list[str]:
    """Why a query's selectors would select nothing: unknown metric, label or value."""
    problems = []
    allowed_anywhere: set[str] = set()
    for sel in selectors(query.promql):
        where = f"{query.where}: {sel.name}"
        if sel.name not in exposed:
            problems.append(f"{where}: no such series is exposed")
            continue
        series = exposed[sel.name]
        # A scraped series carries the target's labels too; the scrape's own `up` and
        # kube-state-metrics' series are listed with theirs.
        labels = set(series["labels"]) | (target_labels if sel.name not in KUBE_STATE_METRICS else set())
        allowed_anywhere |= labels
        values = {**series["values"], **(target_values if sel.name not in KUBE_STATE_METRICS else {})}
        for m in sel.matchers.matchers:
            if m.name == "__name__":
                continue
            if m.name not in labels:
                problems.append(f"{where}: label {m.name!r} is not on this series (it has {sorted(labels)})")
            elif m.name in values and m.value != ".*":
                problems += [f"{where}: {p}" for p in value_problems(m.name, m.op, m.value, values[m.name])]
    # label_replace(v, "dst", ...) makes dst a label of its result.
    allowed_anywhere |= replaced_labels(query.promql)
    for label in sorted(grouping_labels(query.promql) - allowed_anywhere - {"le"}):
        problems.append(f"{query.where}: groups or matches on {label!r}, a label none of its series carries")
    return problems
