"""The Kubernetes manifests under deploy/ render and validate offline, and the validator is live.

Rendering (tests/support/deploy_render.py) uses kustomize (`kustomize build`, else `kubectl kustomize`).
Without either, a kustomization that only lists `resources` (and unhashed generated ConfigMaps) is
assembled by hand (deploy/observability is kept that way on purpose) and one that needs
kustomize's transformers (the base with its model component, the overlays, the components) is
skipped. Each opt-in component under deploy/components/ is rendered on top of the base and of the
llm-d overlay.

Validation uses kubernetes-validate, which bundles the Kubernetes JSON schemas in its wheel, so
nothing is fetched. Strict schemas: an unknown or misspelt field is an error, not ignored."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.deploy_render import (
    BASE, COMPONENTS, DEPLOY, KUSTOMIZATIONS, OBSERVABILITY, kustomize_cmd, load_docs, named, render,
    render_by_hand_applied, render_with_kustomize, tree_id,
)
from tests.support.custom_resources import schema_errors
from tests.support.manifests import TREES


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
