"""deploy/observability (dashboard, alerts) and the autoscalers' queries: every PromQL expression
parses with promtool (Prometheus' own parser; Debian's prometheus package), every selector names
a series decode-server's /metrics really exposes (ours from a `Metrics` registry, vLLM's from
vLLM's own stat logger) with labels and values it really carries, and the dashboard answers the
operator's questions per pool, pod, namespace and model and matches Grafana's
dashboard schema (tests/support/grafana_schema.py). Starts no engine (vLLM's metric names
come from building its stat logger in a subprocess, about 30 s).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from tests.support import exposed_metrics
from tests.support.deploy_render import BASE, LLM_D, MONITORING, Composition, of_kind, pod_labels, render
from tests.support.observability_queries import (
    HPA, KUBE_STATE_METRICS, OPERATOR_TARGET_LABELS, ROOT, Query, adapter_queries, alerts, all_queries, keda_scaled_objects,
    code_label_values, dashboard_queries, keda_queries, load_dashboard, promtool, rule_groups, selector_problems,
    selectors,
)


@pytest.fixture(scope="module")
def exposed() -> dict[str, dict]:
    """Every series name the server's /metrics renders, plus the scrape's `up` and kube-state-metrics'."""
    out = subprocess.run([sys.executable, "-m", "tests.support.exposed_metrics"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"building vLLM's stat logger failed:\n{out.stderr[-4000:]}"
    vllm = json.loads(out.stdout.strip().splitlines()[-1])
    assert "vllm:num_requests_waiting" in vllm and "vllm:nixl_num_failed_transfers" in vllm, sorted(vllm)
    ours = exposed_metrics.ours()
    assert not set(ours) & set(vllm), "our series never share vLLM's names"
    series = exposed_metrics.series({**vllm, **ours})
    # With --api-server-count N the per-process gauge is rendered once per API process, labelled pid
    # (prometheus_client's multiprocess mode, liveall).
    series["decode_server_frontend_cpu_seconds"]["labels"].add("pid")
    return {**series, "up": {"labels": set(), "values": {}}, **KUBE_STATE_METRICS}


def pod_monitor() -> dict:
    (monitor,) = of_kind(render(Composition(BASE, MONITORING)), "PodMonitor")
    return monitor


def target_labels() -> set[str]:
    """The Operator's target labels plus those the base PodMonitor's relabelings add."""
    (endpoint,) = pod_monitor()["spec"]["podMetricsEndpoints"]
    return OPERATOR_TARGET_LABELS | {r["targetLabel"] for r in endpoint["relabelings"]}


def target_values() -> dict[str, set[str]]:
    """job: the PodMonitor's replacement; pool: the pods' llm-d.ai/role (what the relabeling copies);
    reason and cause: what the server's code records."""
    (endpoint,) = pod_monitor()["spec"]["podMetricsEndpoints"]
    (job,) = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    pools = {pod_labels(d)["llm-d.ai/role"] for d in of_kind(render(BASE), "Deployment")}
    return {"job": {job, epp_job()}, "pool": pools}


def epp_job() -> str:
    """The job the llm-d overlay's ServiceMonitor gives the EPP's series (DecodeServerEPPDown's)."""
    (monitor,) = of_kind(render(LLM_D), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    (job,) = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    return job


def problems_of(queries: list[Query], exposed: dict) -> list[str]:
    """Selector problems, with our series' reason and cause values taken from the server's code."""
    code = code_label_values()
    series = {name: {**s, "values": {**s["values"], **code}} if name.startswith("decode_server_") else s for name, s in exposed.items()}
    labels, values = target_labels(), target_values()
    return [p for q in queries for p in selector_problems(q, series, labels, values)]


def test_promtool_parses_every_query(tmp_path):
    """The rules as they are, and every other query as a recording rule, through `promtool check
    rules`; a broken expression makes it fail (the check is live)."""
    tool = promtool()
    others = [q for q in all_queries() if not q.where.startswith("rule ")]
    checked = {"groups": [*rule_groups(), {"name": "queries", "rules": [
        {"record": f"check:query_{i}", "expr": q.promql} for i, q in enumerate(others)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(checked))
    out = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(others) + len(alerts())} rules found" in out.stdout, out.stdout

    broken = {"groups": [{"name": "g", "rules": [{"record": "check:broken", "expr": 'sum by (pool (up)'}]}]}
    path.write_text(yaml.safe_dump(broken))
    out = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "parse error" in (out.stdout + out.stderr), out.stdout + out.stderr


def test_every_selector_names_an_exposed_series(exposed):
    """Each metric exists on the server's /metrics (or is the scrape's up, or kube-state-metrics'
    pod deletion timestamp), each matcher's label is one that series carries, and each value one
    it takes: our reasons and causes as the code records them, vLLM's as vLLM creates them, job and
    pool as the PodMonitor sets them."""
    queries = all_queries()
    assert len(queries) > 40
    assert problems_of(queries, exposed) == []


def test_the_selector_check_is_live(exposed):
    """Typos in a metric, a label, a value, an alternative or a grouping label are each caught."""
    wrong = [
        Query("metric", 'rate(decode_server_request_total{job="decode-server"}[5m])'),
        Query("vllm metric", 'vllm:num_request_waiting{job="decode-server"}'),
        Query("label", 'rate(decode_server_requests_total{output="text"}[5m])'),
        Query("reason", 'rate(decode_server_rejections_total{reason="fingerprint_mismatched"}[5m])'),
        Query("alternative", 'rate(decode_server_rejections_total{reason=~"remote_prefill_failed|remote_prefil_timeout"}[5m])'),
        Query("cause", 'rate(decode_server_aborts_total{cause="disconnect"}[5m])'),
        Query("pool", 'vllm:kv_cache_usage_perc{pool="decoders"}'),
        Query("job", 'up{job="decode-server-decode"}'),
        Query("vllm value", 'vllm:num_requests_waiting_by_reason{reason="queue"}'),
        Query("grouping", 'sum by (pol) (vllm:kv_cache_usage_perc)'),
        Query("kube-state-metrics", 'kube_pod_deletion_timestamp{pool="decode"}'),
        Query("kube-state-metrics value", 'kube_pod_status_phase{phase="pending"}'),
        Query("label_replace elsewhere", 'sum by (pool) (label_replace(kube_pod_status_phase, "role", "$1", "pod", "(.*)"))'),
    ]
    found = problems_of(wrong, exposed)
    assert {p.split(":")[0] for p in found} == {q.where for q in wrong}, found


# ---------------------------------------------------------------- the dashboard

# The operator's questions (issue 24), each as the series a panel must query.
QUESTIONS = {
    "TTFT per output mode": "decode_server_time_to_first_token_seconds_bucket",
    "inter-token latency per output mode": "decode_server_inter_token_latency_seconds_bucket",
    "tokens/s": "vllm:generation_tokens_total",
    "requests by mode and status": "decode_server_requests_total",
    "aborts and disconnects": "decode_server_aborts_total",
    "rejections by reason": "decode_server_rejections_total",
    "queue depth": "vllm:num_requests_waiting",
    "KV-cache use": "vllm:kv_cache_usage_perc",
    "remote KV waits": "vllm:num_requests_kv_fetch_by_stage",
    "KV transfer failures": "vllm:nixl_num_failed_transfers_total",
}
VARIABLES = ("namespace", "pool", "pod", "model_name")


def _panels(dash: dict) -> list[dict]:
    return [p for p in dash["panels"] if p["type"] != "row"]


def test_dashboard_answers_the_operators_questions():
    dash = load_dashboard()
    exprs = [t["expr"] for p in _panels(dash) for t in p["targets"]]
    for question, series in QUESTIONS.items():
        assert any(series in e for e in exprs), f"no panel answers {question!r} ({series})"
    groupings = [set(re.split(r",\s*", g)) for e in exprs for g in re.findall(r"by \(([^)]*)\)", e)]
    for latency in ("time_to_first_token", "inter_token_latency"):
        assert any(f"decode_server_{latency}_seconds_bucket" in e and "by (le, output_mode)" in e for e in exprs), latency
    assert {"output_mode", "status"} <= set().union(*[g for g in groupings if "output_mode" in g]), "requests by mode and status"
    assert any("pod" in g for g in groupings) and any("pool" in g for g in groupings), "per-pool and per-pod panels"
    drift = [e for e in exprs if 'reason="fingerprint_mismatch"' in e]
    remote = [e for e in exprs if "remote_prefill_failed" in e and "remote_prefill_timeout" in e]
    assert drift and remote, "the 409 drift count and the P/D legs' 502/504"


def test_every_dashboard_query_filters_by_the_variables():
    """Each panel selector keeps to this deployment (job) and honours the namespace, pool, pod and
    model variables (the scrape's `up` has no model_name)."""
    dash = load_dashboard()
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names[0] == "datasource" and set(VARIABLES) <= set(names)
    for v in dash["templating"]["list"][1:]:
        assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert v["multi"] and v["includeAll"] and v["allValue"] == ".*", v["name"]
        assert v["query"]["query"] == v["definition"]
    for q in dashboard_queries(dash):
        for sel in selectors(q.promql):
            matchers = {m.name: m.value for m in sel.matchers.matchers}
            wanted = {"job", *VARIABLES} - ({"model_name"} if sel.name == "up" else set())
            if q.where.startswith("variable "):
                wanted = {"job"}  # each variable narrows by the ones before it
            assert wanted <= set(matchers), f"{q.where}: {sel.name} lacks {sorted(wanted - set(matchers))}"
            assert matchers["job"] == "decode-server"


def test_dashboard_layout():
    """Grafana's essentials: unique panel ids, every panel on the Prometheus variable, refIds unique
    per panel, panels inside 24 columns and not overlapping."""
    dash = load_dashboard()
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and p["targets"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)) and all(t["datasource"] == p["datasource"] for t in p["targets"])


@pytest.fixture(scope="module")
def dashboard_problems():
    from tests.support.grafana_schema import dashboard_problems  # grafana-foundation-sdk, the `test` extra

    return dashboard_problems


def test_dashboard_matches_grafanas_schema(dashboard_problems):
    """Every field is one Grafana's dashboard schema has (panel options and queries through their
    plugins' models), with the type, enum value or literal it is declared with (tests/support/grafana_schema.py)."""
    assert dashboard_problems(load_dashboard()) == []


def _first(panels: list[dict], kind: str) -> dict:
    return next(p for p in panels if p["type"] == kind)


# (what is broken, how, the problem reported)
BROKEN_DASHBOARDS = [
    ("misspelt panel field", lambda d: _first(d["panels"], "stat").update(gridpos=_first(d["panels"], "stat").pop("gridPos")),
     "gridpos: not a field"),
    ("misspelt query field", lambda d: _first(d["panels"], "stat")["targets"][0].update(exp="up"), "exp: not a field"),
    ("unknown plugin option", lambda d: _first(d["panels"], "timeseries")["options"].update(legendd={}), "legendd: not a field"),
    ("string for a number", lambda d: _first(d["panels"], "stat")["gridPos"].update(h="8"), "grid_pos.h: expected int"),
    ("value outside an enum", lambda d: d["templating"]["list"][1].update(type="querry"), "type_val: 'querry' is not one of"),
    ("plugin option outside its enum", lambda d: _first(d["panels"], "timeseries")["options"]["tooltip"].update(mode="many"),
     "tooltip.mode: 'many' is not one of"),
    ("number for a string", lambda d: d.update(refresh=30), "refresh: 30 is none of"),
]


@pytest.mark.parametrize("what,break_it,expected", BROKEN_DASHBOARDS, ids=[b[0] for b in BROKEN_DASHBOARDS])
def test_the_schema_check_rejects_a_broken_dashboard(dashboard_problems, what, break_it, expected):
    dash = load_dashboard()
    break_it(dash)
    problems = dashboard_problems(dash)
    assert len(problems) == 1 and expected in problems[0], problems


# ---------------------------------------------------------------- the autoscalers


def test_autoscalers_read_what_the_pod_monitor_scrapes():
    """Each ScaledObject's queries select its own pool (the Deployment it scales) by the job and pool
    labels the PodMonitor sets, and count capacity waits only; the HPA asks for exactly the metric
    names prometheus-adapter's rules serve, from vLLM's series."""
    job = target_values()["job"] - {epp_job()}
    role = {d["metadata"]["name"]: pod_labels(d)["llm-d.ai/role"] for d in of_kind(render(BASE), "Deployment")}
    scaled_objects = keda_scaled_objects()
    assert sorted(s["spec"]["scaleTargetRef"]["name"] for s in scaled_objects) == sorted(role), "one ScaledObject per pool"
    for scaled in scaled_objects:
        pool = role[scaled["spec"]["scaleTargetRef"]["name"]]
        for t in scaled["spec"]["triggers"]:
            (sel,) = selectors(t["metadata"]["query"])
            matchers = {m.name: m.value for m in sel.matchers.matchers}
            assert {matchers["job"]} == job and matchers["pool"] == pool, (scaled["metadata"]["name"], t)
            assert sel.name in ("vllm:num_requests_waiting_by_reason", "vllm:kv_cache_usage_perc")
            if sel.name == "vllm:num_requests_waiting_by_reason":  # capacity waits only, as DecodeServerQueueSaturated
                assert matchers["reason"] == "capacity", t
    served = {q.where.split()[-1]: selectors(q.promql)[0].name for q in adapter_queries() if "seriesQuery" in q.where}
    assert served == {"vllm_num_requests_waiting": "vllm:num_requests_waiting_by_reason", "vllm_kv_cache_usage_perc": "vllm:kv_cache_usage_perc"}
    (waiting,) = [q for q in adapter_queries() if q.where == "adapter metricsQuery vllm_num_requests_waiting"]
    assert 'reason="capacity"' in waiting.promql
    hpa = yaml.safe_load(HPA.read_text())
    assert {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]} == set(served)
    assert hpa["spec"]["scaleTargetRef"]["name"] == "decode-server-decode"
