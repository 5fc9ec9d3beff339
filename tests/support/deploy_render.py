"""The kustomize trees under deploy/, rendered once per test session (shared by the deploy tests).

A tree is a kustomization directory, or a `Composition`: an overlay plus a kustomize Component
(deploy/components/), rendered through a generated overlay that lists both. Rendering uses
kustomize (`kustomize build`, else `kubectl kustomize`); without either, a kustomization that only
lists `resources` and unhashed `configMapGenerator` files is assembled by hand (deploy/observability
is kept that way on purpose) and anything else is skipped, naming why (the base too: it lists the
model component, deploy/components/model-qwen3).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple, Union

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BASE = DEPLOY / "base"
CPU_DEMO = DEPLOY / "overlays" / "cpu-demo"
LLM_D = DEPLOY / "overlays" / "llm-d"
OBSERVABILITY = DEPLOY / "observability"


def _kind(path: Path) -> str:
    return yaml.safe_load(path.read_text()).get("kind", "Kustomization")


KUSTOMIZATIONS = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml") if _kind(p) == "Kustomization")
COMPONENTS = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml") if _kind(p) == "Component")


class Composition(NamedTuple):
    overlay: Path
    component: Path


MONITORING = DEPLOY / "components" / "monitoring"


def _listed_components(tree: Path) -> set[Path]:
    """The components a tree applies: its own and those of the trees it builds on (the base lists
    components/model-qwen3, so every overlay has it)."""
    kust = yaml.safe_load((tree / "kustomization.yaml").read_text())
    listed = {(tree / c).resolve() for c in kust.get("components", [])}
    for entry in kust.get("resources", []):
        if (tree / entry / "kustomization.yaml").is_file():
            listed |= _listed_components(tree / entry)
    return listed


# Each opt-in component (deploy/components/) on the trees that run pools, where the tree does not
# apply it already (the llm-d overlay has monitoring, every tree the base's model-qwen3), and
# monitoring on the cpu demo (opt-in there).
COMPOSITIONS = [
    Composition(o, c) for c in COMPONENTS if c.parent == DEPLOY / "components" for o in (BASE, LLM_D)
    if c.resolve() not in _listed_components(o)
] + [Composition(CPU_DEMO, MONITORING)]
# (tree, component) pairs where the tree lists the component already.
DEDUPE_OK = {(o, c) for c in COMPONENTS for o in (BASE, CPU_DEMO, LLM_D) if c.resolve() in _listed_components(o)}
Tree = Union[Path, Composition]


def tree_id(tree: Tree) -> str:
    if isinstance(tree, Composition):
        return f"{tree.overlay.relative_to(DEPLOY)}+{tree.component.relative_to(DEPLOY)}"
    return str(tree.relative_to(DEPLOY))


def kustomize_cmd() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


LOCAL_CONFIG = "config.kubernetes.io/local-config"


def load_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def applied(docs: list[dict]) -> list[dict]:
    """What kustomize emits: local-config objects (parameters) are dropped."""
    return [d for d in docs if d.get("metadata", {}).get("annotations", {}).get(LOCAL_CONFIG) != "true"]


def render_with_kustomize(directory: Path) -> list[dict]:
    cmd = kustomize_cmd()
    assert cmd is not None
    out = subprocess.run([*cmd, str(directory)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{' '.join(cmd)} {directory} failed:\n{out.stderr[-4000:]}"
    return load_docs(out.stdout)


def _generated_config_map(directory: Path, gen: dict) -> dict:
    """What kustomize makes of a configMapGenerator entry with plain `files` and no name hash."""
    options = gen.get("options", {})
    if not options.get("disableNameSuffixHash") or set(gen) - {"name", "files", "options"}:
        pytest.skip(f"{directory.relative_to(DEPLOY)}: a hashed or literal configMapGenerator needs kustomize, none installed")
    metadata = {"name": gen["name"]}
    if "labels" in options:
        metadata["labels"] = dict(options["labels"])
    data = {Path(f).name: (directory / f).read_text() for f in gen["files"]}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def render_by_hand(directory: Path) -> list[dict]:
    """A kustomization that only lists resources (and unhashed ConfigMaps from files)."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    extra = set(kust) - {"apiVersion", "kind", "resources", "configMapGenerator"}
    if extra:
        pytest.skip(f"{directory.relative_to(DEPLOY)} uses {sorted(extra)}: needs kustomize, none installed")
    docs: list[dict] = []
    for entry in kust.get("resources", []):
        path = directory / entry
        docs += render_by_hand(path) if path.is_dir() else load_docs(path.read_text())
    docs += [_generated_config_map(directory, gen) for gen in kust.get("configMapGenerator", [])]
    return docs


def render_by_hand_applied(directory: Path) -> list[dict]:
    return applied(render_by_hand(directory))


# The namespace compositions are built into: not `default`, so a query or selector that names a
# namespace of its own shows (tests/deploy/test_namespaces.py).
COMPOSED_NAMESPACE = "llm-serving"


def _render_composition(tree: Composition) -> list[dict]:
    """The tree in COMPOSED_NAMESPACE (an overlay of its own, so the namespace is set before the
    component runs, as deploy/README.md tells operators to), the component on top."""
    if kustomize_cmd() is None:
        pytest.skip(f"{tree_id(tree)}: a Component needs kustomize, none installed")
    # kustomize takes only relative paths to directories.
    with tempfile.TemporaryDirectory(prefix="decode-server-compose-") as tmp:
        inner, outer = Path(tmp) / "namespaced", Path(tmp) / "composed"
        inner.mkdir()
        outer.mkdir()
        (inner / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "namespace": COMPOSED_NAMESPACE, "resources": [os.path.relpath(tree.overlay, inner)],
        }))
        (outer / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": COMPOSED_NAMESPACE,
            "resources": ["../namespaced"], "components": [os.path.relpath(tree.component, outer)],
        }))
        return render_with_kustomize(outer)


_rendered: dict[Tree, list[dict]] = {}


def render(tree: Tree) -> list[dict]:
    if tree not in _rendered:
        if isinstance(tree, Composition):
            _rendered[tree] = _render_composition(tree)
        else:
            _rendered[tree] = render_with_kustomize(tree) if kustomize_cmd() else render_by_hand_applied(tree)
    return _rendered[tree]


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[dict], kind: str, name: str) -> dict:
    matches = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def pod_labels(deployment: dict) -> dict:
    return deployment["spec"]["template"]["metadata"]["labels"]


def all_containers(deployment: dict) -> list[dict]:
    """Regular containers and init containers (native sidecars included)."""
    spec = pod_spec(deployment)
    return [*spec.get("initContainers", []), *spec["containers"]]


def port_numbers(deployment: dict) -> dict[str, int]:
    """Every named container port of the pod (all containers), name -> number."""
    return {p["name"]: p["containerPort"] for c in all_containers(deployment) for p in c.get("ports", []) if "name" in p}


def selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()
