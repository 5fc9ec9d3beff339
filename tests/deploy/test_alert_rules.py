"""The PrometheusRule's alerts, evaluated by `promtool test rules` (Prometheus' own rule engine) on
series shaped as the PodMonitor scrapes them: each fires on its fault, with the labels its
annotations name, and stays quiet on the look-alike it must ignore. Every alert has a scenario,
a severity and runbook text. The series names used here are checked against the server's real
/metrics by tests/deploy/test_observability.py (they are the rules' own).
"""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.support.deploy_render import DEPLOY
from tests.support.observability_queries import RULES, alerts, promtool, rule_groups, selectors

DECODE = {"job": "decode-server", "namespace": "ns", "pool": "decode", "pod": "decode-1"}
PREFILL = {"job": "decode-server", "namespace": "ns", "pool": "prefill", "pod": "prefill-1"}
VLLM = {"model_name": "m", "engine": "0"}
# What issue 24 asks the alerts to cover, by alert.
REQUIRED = {
    "engine dead": "DecodeServerEngineDied",
    "5xx rate": "DecodeServerHigh5xxRate",
    "rejection spikes by reason": "DecodeServerRejectionSpike",
    "parser fingerprint drift": "DecodeServerParserFingerprintDrift",
    "queue saturation": "DecodeServerQueueSaturated",
    "drain longer than the grace period": "DecodeServerDrainOverran",
    "drain aborts": "DecodeServerDrainAborts",
}
# What issue 32 adds (item 4), by alert.
REQUIRED_32 = {
    "crash loops during model load": "DecodeServerCrashLooping",
    "pending pods": "DecodeServerPodsPending",
    "pool down with no pod": "DecodeServerPoolUnavailable",
    "TTFT SLO": "DecodeServerTTFTSLO",
    "ITL SLO": "DecodeServerITLSLO",
    "EPP down": "DecodeServerEPPDown",
    "autoscaler at its maximum": "DecodeServerAutoscalerMaxedOut",
    "autoscaler failing (KEDA or prometheus-adapter)": "DecodeServerAutoscalerFailing",
    "memory near the limit": "DecodeServerMemoryNearLimit",
}
# Pods as kube-state-metrics and cAdvisor name them: <Deployment>-<ReplicaSet hash>-<suffix>.
KSM = {"job": "kube-state-metrics", "namespace": "ns"}
DECODE_POD = "decode-server-decode-5d8f-x2k"
PREFILL_POD = "decode-server-prefill-6c9a-q7m"
# An API process of --api-server-count N: its per-process series carry pid (multiprocess mode).
def api(pod: str, pid: int) -> dict:
    return {**DECODE, "pod": pod, "pid": str(pid), "model_name": "m"}


def s(name: str, labels: dict, values: str) -> dict:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def pick(labels: dict, *keys: str) -> dict:
    return {k: labels[k] for k in keys}


# alert -> (input series, {eval minute: [labels of each firing alert]}); [] means none fires.
SCENARIOS = {
    # decode-1 (one process) restarts at minutes 6 and 11: two in 30 minutes, held 5, fires; the
    # prefill pod restarts once: quiet. decode-2 (two API processes) restarts at 5 and 10: new pids.
    "DecodeServerEngineDied": (
        [s("process_start_time_seconds", DECODE, "1000x5 1400x5 1800x40"), s("process_start_time_seconds", PREFILL, "1000x5 1400x40"),
         s("decode_server_frontend_cpu_seconds", api("decode-2", 1), "1x4 _x50"), s("decode_server_frontend_cpu_seconds", api("decode-2", 2), "1x4 _x50"),
         s("decode_server_frontend_cpu_seconds", api("decode-2", 3), "_x5 1x4 _x40"), s("decode_server_frontend_cpu_seconds", api("decode-2", 4), "_x5 1x4 _x40"),
         s("decode_server_frontend_cpu_seconds", api("decode-2", 5), "_x10 1x45"), s("decode_server_frontend_cpu_seconds", api("decode-2", 6), "_x10 1x45")],
        {5: [], 12: [], 22: [pick(DECODE, "namespace", "pool", "pod"), {**pick(DECODE, "namespace", "pool"), "pod": "decode-2"}], 50: []},
    ),
    "DecodeServerDrainAborts": (
        [s("decode_server_aborts_total", {**DECODE, "model_name": "m", "cause": "drain"}, "0x10 3x40"),
         s("decode_server_aborts_total", {**PREFILL, "model_name": "m", "cause": "client_disconnect"}, "0+5x50")],
        {5: [], 15: [pick(DECODE, "namespace", "pool")], 48: []},
    ),
    "DecodeServerPoolDown": (
        [s("up", DECODE, "0x30"), s("up", PREFILL, "1x30")],
        {5: [], 15: [pick(DECODE, "namespace", "pool")]},
    ),
    "DecodeServerHigh5xxRate": (
        [s("decode_server_requests_total", {**DECODE, "output_mode": "text", "status": "200"}, "0+90x30"),
         s("decode_server_requests_total", {**DECODE, "output_mode": "text", "status": "503"}, "0+10x30"),
         s("decode_server_requests_total", {**PREFILL, "output_mode": "tokens", "status": "200"}, "0+99x30"),
         s("decode_server_requests_total", {**PREFILL, "output_mode": "tokens", "status": "502"}, "0+1x30"),
         s("decode_server_requests_total", {**PREFILL, "output_mode": "tokens", "status": "499"}, "0+50x30")],
        {15: [pick(DECODE, "namespace", "pool")]},
    ),
    "DecodeServerRejectionSpike": (
        [s("decode_server_requests_total", {**DECODE, "output_mode": "text", "status": "400"}, "0+60x30"),
         s("decode_server_rejections_total", {**DECODE, "reason": "invalid_json"}, "0+30x30"),
         s("decode_server_rejections_total", {**DECODE, "reason": "draining"}, "0+30x30"),
         s("decode_server_rejections_total", {**DECODE, "reason": "too_large"}, "0+3x30")],
        {5: [], 15: [{**pick(DECODE, "namespace", "pool"), "reason": "invalid_json"}]},
    ),
    "DecodeServerParserFingerprintDrift": (
        [s("decode_server_rejections_total", {**DECODE, "reason": "fingerprint_mismatch"}, "0+1x40"),
         s("decode_server_rejections_total", {**PREFILL, "reason": "fingerprint_mismatch"}, "0x40")],
        {10: [], 25: [pick(DECODE, "namespace", "pool")]},
    ),
    "DecodeServerQueueSaturated": (
        [s("vllm:num_requests_waiting_by_reason", {**DECODE, **VLLM, "reason": "capacity"}, "3x20"),
         s("vllm:num_requests_waiting_by_reason", {**PREFILL, **VLLM, "reason": "capacity"}, "0x20"),
         s("vllm:num_requests_waiting_by_reason", {**PREFILL, **VLLM, "reason": "deferred"}, "5x20")],
        {5: [], 15: [{**pick(DECODE, "namespace", "pool", "pod"), "model_name": "m"}]},
    ),
    "DecodeServerKVCacheFull": (
        [s("vllm:kv_cache_usage_perc", {**DECODE, **VLLM}, "0.97x20"), s("vllm:kv_cache_usage_perc", {**PREFILL, **VLLM}, "0.5x20")],
        {15: [{**pick(DECODE, "namespace", "pool", "pod"), "model_name": "m"}]},
    ),
    # decode-1: 1 in 10 decode legs times out (fires); decode-2: 1 in 100 fails (under 5%, quiet).
    "DecodeServerRemotePrefillFailing": (
        [s("decode_server_remote_prefill_total", {**DECODE, "outcome": "ok"}, "0+9x20"),
         s("decode_server_remote_prefill_total", {**DECODE, "outcome": "timeout"}, "0+1x20"),
         s("decode_server_remote_prefill_total", {**DECODE, "pod": "decode-2", "outcome": "ok"}, "0+99x20"),
         s("decode_server_remote_prefill_total", {**DECODE, "pod": "decode-2", "outcome": "failed"}, "0+1x20")],
        {3: [], 10: [{**pick(DECODE, "namespace", "pod"), "outcome": "timeout"}]},
    ),
    # decode: in CrashLoopBackOff throughout; prefill: a long model load, so rarely sampled in
    # back-off, but its third restart within the hour comes at minute 28 (pending 15: fires by 50);
    # another pod of ours restarts once (quiet), and a pod of another app with a container of the
    # same name crash-loops (not ours: quiet).
    "DecodeServerCrashLooping": (
        [s("kube_pod_container_status_waiting_reason", {**KSM, "pod": DECODE_POD, "uid": "a", "container": "decode-server", "reason": "CrashLoopBackOff"}, "1x40"),
         s("kube_pod_container_status_restarts_total", {**KSM, "pod": DECODE_POD, "uid": "a", "container": "decode-server"}, "0+1x40"),
         s("kube_pod_container_status_restarts_total", {**KSM, "pod": PREFILL_POD, "uid": "b", "container": "decode-server"}, "0x5 1x10 2x10 3x40"),
         s("kube_pod_container_status_restarts_total", {**KSM, "pod": "decode-server-decode-5d8f-p3z", "uid": "c", "container": "decode-server"}, "0x5 1x60"),
         s("kube_pod_container_status_waiting_reason", {**KSM, "pod": "web-7f-abc", "uid": "d", "container": "decode-server", "reason": "CrashLoopBackOff"}, "1x60")],
        {10: [], 20: [{"namespace": "ns", "pod": DECODE_POD, "pool": "decode"}],
         50: [{"namespace": "ns", "pod": DECODE_POD, "pool": "decode"}, {"namespace": "ns", "pod": PREFILL_POD, "pool": "prefill"}]},
    ),
    # decode pod: Pending throughout; prefill pod: Pending for 5 minutes (an image pull), then Running.
    "DecodeServerPodsPending": (
        [s("kube_pod_status_phase", {**KSM, "pod": DECODE_POD, "uid": "a", "phase": "Pending"}, "1x30"),
         s("kube_pod_status_phase", {**KSM, "pod": DECODE_POD, "uid": "a", "phase": "Running"}, "0x30"),
         s("kube_pod_status_phase", {**KSM, "pod": PREFILL_POD, "uid": "b", "phase": "Pending"}, "1x5 0x25"),
         s("kube_pod_status_phase", {**KSM, "pod": PREFILL_POD, "uid": "b", "phase": "Running"}, "0x5 1x25")],
        {10: [], 20: [{"namespace": "ns", "pod": DECODE_POD, "pool": "decode"}]},
    ),
    # decode: wants 2, has none; prefill: scaled to 0 on purpose (quiet); the EPP's Deployment is
    # not a pool (quiet here: DecodeServerEPPDown's).
    "DecodeServerPoolUnavailable": (
        [s("kube_deployment_status_replicas_available", {**KSM, "deployment": "decode-server-decode"}, "0x30"),
         s("kube_deployment_spec_replicas", {**KSM, "deployment": "decode-server-decode"}, "2x30"),
         s("kube_deployment_status_replicas_available", {**KSM, "deployment": "decode-server-prefill"}, "0x30"),
         s("kube_deployment_spec_replicas", {**KSM, "deployment": "decode-server-prefill"}, "0x30"),
         s("kube_deployment_status_replicas_available", {**KSM, "deployment": "decode-server-epp"}, "0x30"),
         s("kube_deployment_spec_replicas", {**KSM, "deployment": "decode-server-epp"}, "2x30")],
        {5: [], 15: [{"namespace": "ns", "deployment": "decode-server-decode", "pool": "decode"}]},
    ),
    # decode at 95% of its limit, prefill at 50%; the pod-level cgroup (container="") is not ours.
    "DecodeServerMemoryNearLimit": (
        [s("container_memory_working_set_bytes", {"job": "kubelet", "namespace": "ns", "pod": DECODE_POD, "container": "decode-server"}, "95x30"),
         s("container_memory_working_set_bytes", {"job": "kubelet", "namespace": "ns", "pod": DECODE_POD, "container": ""}, "99x30"),
         s("container_memory_working_set_bytes", {"job": "kubelet", "namespace": "ns", "pod": PREFILL_POD, "container": "decode-server"}, "50x30"),
         s("kube_pod_container_resource_limits", {**KSM, "pod": DECODE_POD, "uid": "a", "container": "decode-server", "resource": "memory", "unit": "byte"}, "100x30"),
         s("kube_pod_container_resource_limits", {**KSM, "pod": DECODE_POD, "uid": "a", "container": "decode-server", "resource": "cpu", "unit": "core"}, "8x30"),
         s("kube_pod_container_resource_limits", {**KSM, "pod": PREFILL_POD, "uid": "b", "container": "decode-server", "resource": "memory", "unit": "byte"}, "100x30")],
        {5: [], 15: [{"namespace": "ns", "pod": DECODE_POD, "container": "decode-server", "pool": "decode"}]},
    ),
    # ns: the EPP is scraped and answers no more; ns2: its Deployment has no pod left (no target,
    # no up series); ns3: healthy.
    "DecodeServerEPPDown": (
        [s("up", {"job": "decode-server-epp", "namespace": "ns", "pod": "decode-server-epp-1"}, "0x20"),
         s("kube_deployment_status_replicas_available", {**KSM, "namespace": "ns2", "deployment": "decode-server-epp"}, "0x20"),
         s("up", {"job": "decode-server-epp", "namespace": "ns3", "pod": "decode-server-epp-1"}, "1x20"),
         s("kube_deployment_status_replicas_available", {**KSM, "namespace": "ns3", "deployment": "decode-server-epp"}, "2x20")],
        {3: [], 10: [{"namespace": "ns"}, {"namespace": "ns2"}]},
    ),
    # decode: 1 in 10 first tokens after 2.5 s (fires); prefill: 1 in 100 (quiet).
    "DecodeServerTTFTSLO": (
        [s("vllm:time_to_first_token_seconds_bucket", {**DECODE, **VLLM, "le": "2.5"}, "0+9x30"),
         s("vllm:time_to_first_token_seconds_count", {**DECODE, **VLLM}, "0+10x30"),
         s("vllm:time_to_first_token_seconds_bucket", {**PREFILL, **VLLM, "le": "2.5"}, "0+99x30"),
         s("vllm:time_to_first_token_seconds_count", {**PREFILL, **VLLM}, "0+100x30")],
        {5: [], 20: [{**pick(DECODE, "namespace", "pool"), "model_name": "m"}]},
    ),
    # decode: 1 in 10 gaps over 100 ms (fires); prefill: 1 in 100 (quiet).
    "DecodeServerITLSLO": (
        [s("vllm:inter_token_latency_seconds_bucket", {**DECODE, **VLLM, "le": "0.1"}, "0+90x30"),
         s("vllm:inter_token_latency_seconds_count", {**DECODE, **VLLM}, "0+100x30"),
         s("vllm:inter_token_latency_seconds_bucket", {**PREFILL, **VLLM, "le": "0.1"}, "0+990x30"),
         s("vllm:inter_token_latency_seconds_count", {**PREFILL, **VLLM}, "0+1000x30")],
        {5: [], 20: [{**pick(DECODE, "namespace", "pool"), "model_name": "m"}]},
    ),
    # KEDA's HPA for the decode pool at its maximum; the prefill pool's HPA has room (quiet).
    "DecodeServerAutoscalerMaxedOut": (
        [s("kube_horizontalpodautoscaler_status_current_replicas", {**KSM, "horizontalpodautoscaler": "keda-hpa-decode-server-decode"}, "8x30"),
         s("kube_horizontalpodautoscaler_spec_max_replicas", {**KSM, "horizontalpodautoscaler": "keda-hpa-decode-server-decode"}, "8x30"),
         s("kube_horizontalpodautoscaler_status_current_replicas", {**KSM, "horizontalpodautoscaler": "decode-server-prefill"}, "2x30"),
         s("kube_horizontalpodautoscaler_spec_max_replicas", {**KSM, "horizontalpodautoscaler": "decode-server-prefill"}, "8x30")],
        {10: [], 20: [{"namespace": "ns", "horizontalpodautoscaler": "keda-hpa-decode-server-decode", "pool": "decode"}]},
    ),
    # The decode pool's HPA cannot read its metric; the prefill pool's can.
    "DecodeServerAutoscalerFailing": (
        [s("kube_horizontalpodautoscaler_status_condition", {**KSM, "horizontalpodautoscaler": "decode-server-decode", "condition": "ScalingActive", "status": "false"}, "1x30"),
         s("kube_horizontalpodautoscaler_status_condition", {**KSM, "horizontalpodautoscaler": "decode-server-decode", "condition": "ScalingActive", "status": "true"}, "0x30"),
         s("kube_horizontalpodautoscaler_status_condition", {**KSM, "horizontalpodautoscaler": "keda-hpa-decode-server-prefill", "condition": "ScalingActive", "status": "false"}, "0x30"),
         s("kube_horizontalpodautoscaler_status_condition", {**KSM, "horizontalpodautoscaler": "keda-hpa-decode-server-prefill", "condition": "ScalingActive", "status": "true"}, "1x30")],
        {5: [], 15: [{"namespace": "ns", "horizontalpodautoscaler": "decode-server-decode", "pool": "decode"}]},
    ),
    # promtool's clock starts at 0: deletion timestamps of 300 s and 900 s are grace periods that
    # end at minutes 5 and 15. A deleted pod that is not ours (no up series) never counts.
    "DecodeServerDrainOverran": (
        [s("kube_pod_deletion_timestamp", {"namespace": "ns", "pod": "decode-1", "uid": "a"}, "300x20"),
         s("kube_pod_deletion_timestamp", {"namespace": "ns", "pod": "prefill-1", "uid": "b"}, "900x20"),
         s("kube_pod_deletion_timestamp", {"namespace": "ns", "pod": "other", "uid": "c"}, "0x20"),
         s("up", DECODE, "0x20"), s("up", PREFILL, "0x20")],
        {4: [], 8: [{"namespace": "ns", "pod": "decode-1"}]},
    ),
}


def severity(alert: str) -> str:
    (rule,) = [a for a in alerts() if a["alert"] == alert]
    return rule["labels"]["severity"]


def unit_tests() -> dict:
    tests = []
    for alert, (series, expected) in SCENARIOS.items():
        checks = []
        for minute, firing in expected.items():
            samples = [{"labels": "ALERTS" + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(
                {**labels, "alertname": alert, "alertstate": "firing", "severity": severity(alert)}.items())) + "}", "value": 1}
                for labels in firing]
            checks.append({"expr": f'ALERTS{{alertname="{alert}", alertstate="firing"}}', "eval_time": f"{minute}m", "exp_samples": samples})
        tests.append({"name": alert, "interval": "1m", "input_series": series, "promql_expr_test": checks})
    return {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}


def run_promtool_tests(tmp_path, groups: list[dict], tests: dict) -> subprocess.CompletedProcess:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    return subprocess.run([promtool(), "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_every_alert_has_a_scenario_severity_and_runbook():
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names))
    assert set(names) == set(SCENARIOS), "each alert needs a scenario below"
    assert set(REQUIRED.values()) | set(REQUIRED_32.values()) <= set(names)
    for a in alerts():
        assert a["labels"]["severity"] in ("critical", "warning"), a["alert"]
        for key in ("summary", "description", "runbook"):
            assert len(a["annotations"].get(key, "").strip()) > 20, f"{a['alert']}: annotation {key}"


def test_runbook_paths_point_at_a_section_of_the_repository():
    """Every alert's runbook annotation is a link to its own section of deploy/RUNBOOK.md: the file
    exists and has a heading with that anchor (GitHub's: lower case, spaces to dashes)."""
    linked = [(a["alert"], a["annotations"]["runbook"].strip()) for a in alerts()]
    for alert, link in linked:
        assert link == f"deploy/RUNBOOK.md#{alert.lower()}", f"{alert}: runbook {link!r}"
        path, _, anchor = link.partition("#")
        target = DEPLOY.parent / path
        assert target.is_file(), f"{alert}: {path} does not exist"
        anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", target.read_text(), re.M)}
        assert anchor in anchors, f"{alert}: no heading #{anchor} in {path}"


def test_alerts_that_need_kube_state_metrics_say_so():
    """An alert reading kube-state-metrics' series says so in its description (an operator without
    it must know the alert is silent), and one reading none does not claim to."""
    for a in alerts():
        reads = {sel.name for sel in selectors(a["expr"])}
        needs = any(name.startswith("kube_") for name in reads)
        assert needs == ("kube-state-metrics" in a["annotations"]["description"]), a["alert"]
        if "container_memory_working_set_bytes" in reads:
            assert "cAdvisor" in a["annotations"]["description"], a["alert"]


def test_every_alert_holds_for_a_while():
    """Each alert has a `for:` (a single bad evaluation never pages)."""
    missing = [a["alert"] for a in alerts() if "for" not in a]
    assert missing == []


def test_annotations_name_only_labels_the_alert_has():
    """{{ $labels.x }} in an annotation must be a label of the firing alert (else it renders empty)."""
    for alert, (_, expected) in SCENARIOS.items():
        (rule,) = [a for a in alerts() if a["alert"] == alert]
        used = {m for text in rule["annotations"].values() for m in re.findall(r"\$labels\.(\w+)", text)}
        for firing in (f for fs in expected.values() for f in fs):
            assert used <= set(firing), f"{alert} annotations use {sorted(used - set(firing))}, which it does not carry"


def test_alerts_fire_on_their_faults(tmp_path):
    out = run_promtool_tests(tmp_path, rule_groups(), unit_tests())
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_the_scenarios_can_fail(tmp_path):
    """A rule with a wrong threshold or selector fails its scenario (the harness is live)."""
    groups = yaml.safe_load(RULES.read_text())["spec"]["groups"]
    for group in groups:
        for rule in group["rules"]:
            if rule.get("alert") == "DecodeServerHigh5xxRate":
                rule["expr"] = rule["expr"].replace("> 0.05", "> 0.5")
            if rule.get("alert") == "DecodeServerQueueSaturated":
                rule["expr"] = rule["expr"].replace('reason="capacity"', 'reason="deferred"')
            if rule.get("alert") == "DecodeServerCrashLooping":  # no pool label: the alert's labels differ
                rule["expr"] = rule["expr"].replace('"pool", "$1"', '"role", "$1"')
    out = run_promtool_tests(tmp_path, groups, unit_tests())
    failed = set(re.findall(r'expr: "ALERTS\{alertname=\\"(\w+)\\"', out.stdout + out.stderr))
    assert out.returncode != 0 and failed == {"DecodeServerHigh5xxRate", "DecodeServerQueueSaturated", "DecodeServerCrashLooping"}, \
        out.stdout + out.stderr
