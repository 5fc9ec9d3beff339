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

from tests.support.observability_queries import RULES, alerts, promtool, rule_groups

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
}


def s(name: str, labels: dict, values: str) -> dict:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def pick(labels: dict, *keys: str) -> dict:
    return {k: labels[k] for k in keys}


# alert -> (input series, {eval minute: [labels of each firing alert]}); [] means none fires.
SCENARIOS = {
    "DecodeServerEngineDied": (
        [s("process_start_time_seconds", DECODE, "1000x5 1400x40"), s("process_start_time_seconds", PREFILL, "1000x45")],
        {4: [], 10: [DECODE], 25: []},
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
    assert set(REQUIRED.values()) <= set(names)
    for a in alerts():
        assert a["labels"]["severity"] in ("critical", "warning"), a["alert"]
        for key in ("summary", "description", "runbook"):
            assert len(a["annotations"].get(key, "").strip()) > 20, f"{a['alert']}: annotation {key}"


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
    out = run_promtool_tests(tmp_path, groups, unit_tests())
    failed = set(re.findall(r'expr: "ALERTS\{alertname=\\"(\w+)\\"', out.stdout + out.stderr))
    assert out.returncode != 0 and failed == {"DecodeServerHigh5xxRate", "DecodeServerQueueSaturated"}, out.stdout + out.stderr
