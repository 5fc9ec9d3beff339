"""Every namespace the rendered manifests name comes from the build or a parameter: built into a
namespace that is not `default`, with Prometheus' namespace set as a parameter, no query, URL,
selector or object names `default` or `monitoring` (the old hard-coded values), and the release
label kube-prometheus-stack selects by is the parameter's.

Each tree is built as an operator builds it (deploy/README.md): an overlay setting the namespace
with the tree as its resource, and above it one with the same namespace (for the objects the
components add) listing a Component that sets the parameters (ConfigMap decode-server-params,
deploy/base/params.yaml) and then the opt-in component.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.support.deploy_render import BASE, COMPONENTS, CPU_DEMO, DEDUPE_OK, DEPLOY, LLM_D, kustomize_cmd, render_with_kustomize

NAMESPACE = "team-a"
PARAMS = {"release": "obs-stack", "namespace": "obs", "prometheus": "http://obs-prometheus.obs.svc:9090"}
# llm-d's overlay sets llm-d's monitoring itself (deploy/overlays/llm-d/params).
LLM_D_PARAMS = {"release": "llmd", "namespace": "llm-d-monitoring"}
OPT_IN = [c for c in COMPONENTS if c.parent == DEPLOY / "components" and c.name != "gke-proxy-only-subnet"]
CASES = [(tree, component) for tree in (BASE, CPU_DEMO, LLM_D) for component in (None, *OPT_IN)
         if not (component is not None and (tree, component) in DEDUPE_OK)]


def build(tree: Path, component: Path | None) -> list[dict]:
    if kustomize_cmd() is None:
        pytest.fail("kustomize or kubectl is needed to build the overlays")
    with tempfile.TemporaryDirectory(prefix="decode-server-ns-") as tmp:
        inner, params, outer = (Path(tmp) / d for d in ("namespaced", "params", "composed"))
        for d in (inner, params, outer):
            d.mkdir()
        (inner / "kustomization.yaml").write_text(yaml.safe_dump({
            "kind": "Kustomization", "namespace": NAMESPACE, "resources": [os.path.relpath(tree, inner)]}))
        (params / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component",
            "patches": [{"target": {"kind": "ConfigMap", "name": "decode-server-params"},
                         "patch": yaml.safe_dump([{"op": "replace", "path": f"/data/{k}", "value": v} for k, v in PARAMS.items()])}]}))
        components = ["../params", *([os.path.relpath(component, outer)] if component else [])]
        (outer / "kustomization.yaml").write_text(yaml.safe_dump({
            "kind": "Kustomization", "namespace": NAMESPACE, "resources": ["../namespaced"], "components": components}))
        return render_with_kustomize(outer)


def named_namespaces(docs: list[dict]) -> set[str]:
    """Namespaces named anywhere: objects' own, NetworkPolicy namespace selectors, PromQL
    namespace="..." matchers and in-cluster URLs (NAME.NAMESPACE.svc)."""
    found: set[str] = set()

    def walk(node, key=None):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "kubernetes.io/metadata.name" and isinstance(v, str):
                    found.add(v)
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif isinstance(node, str):
            found.update(re.findall(r'namespace="([^"]*)"', node))
            found.update(re.findall(r"://[a-z0-9-]+\.([a-z0-9-]+)\.svc", node))

    for d in docs:
        found.add(d["metadata"].get("namespace", "<none>"))
        walk(d)
    return found


@pytest.mark.parametrize("tree,component", CASES, ids=lambda v: "-" if v is None else str(v.relative_to(DEPLOY)))
def test_namespaces_come_from_the_build_and_the_parameters(tree, component):
    docs = build(tree, component)
    params = LLM_D_PARAMS if tree == LLM_D else PARAMS
    # On llm-d, a component above the overlay reads the parameters as set above it.
    allowed = {NAMESPACE, params["namespace"]} | ({PARAMS["namespace"]} if component else set())
    named = named_namespaces(docs)
    assert named <= allowed, f"namespaces not from the build or the parameters: {sorted(named - allowed)}"
    assert not {"default", "monitoring"} & named
    assert all(d["metadata"]["namespace"] == NAMESPACE for d in docs)
    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            assert d["metadata"]["labels"]["release"] == params["release"], d["metadata"]["name"]
        if d["kind"] == "ScaledObject":
            for trigger in d["spec"]["triggers"]:
                assert trigger["metadata"]["serverAddress"] == PARAMS["prometheus"]
                assert f'namespace="{NAMESPACE}"' in trigger["metadata"]["query"]
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "decode-server-params"], \
        "the parameters are local-config: never applied"


def test_the_check_sees_a_hard_coded_namespace():
    docs = [{"metadata": {"namespace": NAMESPACE}, "spec": {"q": 'up{namespace="default"}', "u": "http://p.monitoring.svc:9090"}}]
    assert named_namespaces(docs) == {NAMESPACE, "default", "monitoring"}
