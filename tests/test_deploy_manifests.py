"""The Kubernetes manifests under deploy/: rendered, schema-validated offline, and checked for the
things the server relies on (probes, drain, pool flags). Starts no engine.

Rendering uses kustomize (`kustomize build`, else `kubectl kustomize`). Without either, a
kustomization that only lists `resources` is assembled by hand (the base is kept that way on
purpose) and one that needs kustomize's transformers (the overlays) is skipped.

Validation uses kubernetes-validate, which bundles the Kubernetes JSON schemas in its wheel, so
nothing is fetched. Strict schemas: an unknown or misspelt field is an error, not ignored.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate  # the `test` extra; bundles the schemas
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
BASE = DEPLOY / "base"
CPU_DEMO = DEPLOY / "overlays" / "cpu-demo"
KUSTOMIZATIONS = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))

# The oldest Kubernetes the manifests target, and the newest schema set bundled.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())

DRAIN_TIMEOUT_FLAG = "--drain-timeout"
PARSER_FLAGS = ["--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
PART_OF = {"app.kubernetes.io/name": "decode-server", "app.kubernetes.io/part-of": "decode-server"}


# ---------------------------------------------------------------- rendering


def _kustomize_cmd() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def _load_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def render_with_kustomize(directory: Path) -> list[dict]:
    cmd = _kustomize_cmd()
    assert cmd is not None
    out = subprocess.run([*cmd, str(directory)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{' '.join(cmd)} {directory} failed:\n{out.stderr[-4000:]}"
    return _load_docs(out.stdout)


def render_by_hand(directory: Path) -> list[dict]:
    """A kustomization that only lists resources: its files' documents, in order."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    extra = set(kust) - {"apiVersion", "kind", "resources"}
    if extra:
        pytest.skip(f"{directory.relative_to(DEPLOY)} uses {sorted(extra)}: needs kustomize, none installed")
    docs: list[dict] = []
    for entry in kust.get("resources", []):
        path = directory / entry
        docs += render_by_hand(path) if path.is_dir() else _load_docs(path.read_text())
    return docs


_rendered: dict[Path, list[dict]] = {}


def render(directory: Path) -> list[dict]:
    if directory not in _rendered:
        _rendered[directory] = render_with_kustomize(directory) if _kustomize_cmd() else render_by_hand(directory)
    return _rendered[directory]


def _id(directory: Path) -> str:
    return str(directory.relative_to(DEPLOY))


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[dict], kind: str, name: str) -> dict:
    matches = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def container(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_map(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def expand(c: dict) -> list[str]:
    """The container's argv after Kubernetes' $(VAR) expansion of literal env values."""
    values = {name: e["value"] for name, e in env_map(c).items() if "value" in e}
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m[1], m[0]), a) for a in [*c["command"], *c["args"]]]


def flag_value(argv: list[str], flag: str) -> str:
    assert flag in argv, f"{flag} missing from {argv}"
    return argv[argv.index(flag) + 1]


# ---------------------------------------------------------------- schema validation


def schema_errors(docs: list[dict]) -> list[str]:
    errors = []
    for doc in docs:
        what = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                errors.append(f"{what} (k8s {version}) at {path or '<root>'}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                errors.append(f"{what}: {e.message}")
    return errors


def test_validator_rejects_a_broken_manifest():
    """The validator is live: a typo'd field and a wrong type are both caught."""
    deployment = named(render(BASE), "Deployment", "decode-server-decode")
    typo = json.loads(json.dumps(deployment))
    typo["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    wrong_type = json.loads(json.dumps(deployment))
    wrong_type["spec"]["replicas"] = "one"
    assert schema_errors([deployment]) == []
    assert schema_errors([typo]) and schema_errors([wrong_type])


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=_id)
def test_renders_and_matches_kubernetes_schemas(directory):
    docs = render(directory)
    assert docs, f"{_id(directory)} rendered nothing"
    assert schema_errors(docs) == []


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=_id)
def test_every_listed_resource_file_is_valid_on_its_own(directory):
    """Each file in `resources` is a whole object (not a fragment) and valid as written."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    for entry in kust.get("resources", []):
        path = directory / entry
        if path.is_dir():
            assert (path / "kustomization.yaml").is_file(), f"{path} is not a kustomization"
            continue
        docs = _load_docs(path.read_text())
        assert docs, f"{path} is empty"
        assert schema_errors(docs) == [], path


def test_no_stray_manifest_files():
    """Every YAML file under deploy/ is a kustomization, or used by one (a resource or a patch)."""
    used = set()
    for directory in KUSTOMIZATIONS:
        kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
        used |= {(directory / r).resolve() for r in kust.get("resources", [])}
        used |= {(directory / p["path"]).resolve() for p in kust.get("patches", []) if "path" in p}
    stray = [
        str(p.relative_to(DEPLOY))
        for p in DEPLOY.rglob("*.y*ml")
        if p.name != "kustomization.yaml" and p.resolve() not in used
    ]
    assert stray == []


def test_by_hand_render_of_the_base_matches_kustomize():
    """The no-kustomize fallback renders the base exactly as kustomize does."""
    if _kustomize_cmd() is None:
        pytest.skip("no kustomize or kubectl")

    def key(d):
        return (d["kind"], d["metadata"]["name"])

    assert sorted(render_by_hand(BASE), key=key) == sorted(render_with_kustomize(BASE), key=key)


# ---------------------------------------------------------------- wiring


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=_id)
def test_labels_and_selectors_line_up(directory):
    docs = render(directory)
    deployments = of_kind(docs, "Deployment")
    assert deployments
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        assert PART_OF.items() <= labels.items(), f"{doc['kind']}/{doc['metadata']['name']} labels {labels}"
    for d in deployments:
        pod_labels = d["spec"]["template"]["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert d["metadata"]["labels"] == pod_labels
    for kind, selector_of in (
        ("Service", lambda s: s["spec"]["selector"]),
        ("PodDisruptionBudget", lambda p: p["spec"]["selector"]["matchLabels"]),
    ):
        for obj in of_kind(docs, kind):
            selector = selector_of(obj)
            matched = [d for d in deployments if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
            assert len(matched) == 1, f"{kind}/{obj['metadata']['name']} selects {len(matched)} Deployments"
    for svc in of_kind(docs, "Service"):
        target = next(d for d in deployments if svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items())
        port_names = {p["name"] for p in container(target)["ports"]}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in port_names
    # Each Deployment is covered by a PDB.
    for d in deployments:
        pdbs = [p for p in of_kind(docs, "PodDisruptionBudget") if p["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(pdbs) == 1, f"Deployment/{d['metadata']['name']} has {len(pdbs)} PDBs"


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=_id)
def test_probes_drain_and_security(directory):
    for d in of_kind(render(directory), "Deployment"):
        pod = d["spec"]["template"]["spec"]
        c = container(d)
        argv = expand(c)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert int(flag_value(argv, "--port")) == ports["http"]
        assert flag_value(argv, "--host") == "0.0.0.0"

        assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        assert c["startupProbe"]["httpGet"]["path"] == "/health"
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert c[probe]["httpGet"]["port"] in ("http", ports["http"])

        # SIGTERM comes after preStop; the drain must finish inside the grace period.
        drain = int(flag_value(argv, DRAIN_TIMEOUT_FLAG))
        pre_stop = c["lifecycle"]["preStop"]
        pre_stop_s = int(pre_stop["exec"]["command"][1]) if "exec" in pre_stop else pre_stop["sleep"]["seconds"]
        assert 0 < pre_stop_s < 30
        grace = pod["terminationGracePeriodSeconds"]
        assert grace > drain + pre_stop_s, f"grace {grace}s <= drain {drain}s + preStop {pre_stop_s}s"

        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        if c["securityContext"].get("readOnlyRootFilesystem"):
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert {"/home/app", "/tmp"} <= mounts, "a read-only root needs a writable $HOME (caches) and /tmp"

        api_key = env_map(c)["DECODE_SERVER_API_KEY"]["valueFrom"]["secretKeyRef"]
        assert api_key["optional"] is True


def test_base_pools():
    docs = render(BASE)
    decode = named(docs, "Deployment", "decode-server-decode")
    prefill = named(docs, "Deployment", "decode-server-prefill")
    assert {d["metadata"]["name"] for d in of_kind(docs, "Deployment")} == {"decode-server-decode", "decode-server-prefill"}
    named(docs, "Service", "decode-server-decode")
    named(docs, "Service", "decode-server-prefill")

    roles = {}
    for d in (decode, prefill):
        c = container(d)
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
    decode_argv, prefill_argv = expand(container(decode)), expand(container(prefill))
    assert "--tokens-only" in prefill_argv and "--tokens-only" not in decode_argv
    assert " ".join(PARSER_FLAGS) in " ".join(decode_argv)
    assert not {"--reasoning-parser", "--tool-call-parser"} & set(prefill_argv)
    # Both pools serve the same model, or the KV handed over is meaningless.
    assert decode_argv[2] == prefill_argv[2]


def test_cpu_demo_overlay():
    if _kustomize_cmd() is None:
        pytest.skip("no kustomize or kubectl")
    docs = render(CPU_DEMO)
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "PodDisruptionBudget"}
    (deployment,) = of_kind(docs, "Deployment")
    c = container(deployment)
    argv = expand(c)
    assert argv[2].startswith("-"), f"no MODEL argument, so the server serves its demo model: {argv}"
    assert "--kv-transfer-config" not in argv and "--tokens-only" not in argv
    assert " ".join(PARSER_FLAGS) in " ".join(argv)
    assert not any("nvidia.com/gpu" in r for r in c["resources"].values())
    assert "cpu" in c["image"]
    assert not {"MODEL", "VLLM_NIXL_SIDE_CHANNEL_HOST"} & set(env_map(c))


# ---------------------------------------------------------------- against the server itself


@pytest.fixture(scope="module")
def serve_parser():
    from decode_server.cli import build_parser

    return build_parser()


def _all_deployments():
    out = []
    for directory in KUSTOMIZATIONS:
        if directory != BASE and _kustomize_cmd() is None:
            continue
        out += [(directory, d) for d in of_kind(render(directory), "Deployment")]
    return out


@pytest.mark.parametrize(
    "directory,deployment",
    _all_deployments(),
    ids=lambda v: _id(v) if isinstance(v, Path) else v["metadata"]["name"],
)
def test_server_cli_accepts_the_manifest_args(serve_parser, directory, deployment):
    """The argv each pod runs parses with decode-server's own CLI (vLLM engine flags included)."""
    argv = expand(container(deployment))
    assert argv[0] == "decode-server"
    try:
        args = serve_parser.parse_args(argv[1:])
    except SystemExit as e:  # argparse reports on stderr and exits 2
        pytest.fail(f"decode-server rejects {argv[1:]} (exit {e.code}); see captured stderr")
    assert args.command == "serve"
    assert args.host == "0.0.0.0" and args.port == 8000
    assert args.drain_timeout == int(flag_value(argv, DRAIN_TIMEOUT_FLAG))
    if "--kv-transfer-config" in argv:
        expected_role = "kv_producer" if args.tokens_only else "kv_consumer"
        assert args.kv_transfer_config.kv_connector == "NixlConnector"
        assert args.kv_transfer_config.kv_role == expected_role


def test_server_serves_the_probed_routes():
    """/ready and /health, which the probes hit, are routes of the app (built, not started)."""
    from decode_server.app import build_app
    from decode_server.service import ServerConfig

    app = build_app(lambda: None, ServerConfig(served_model_names=("probe",)))
    paths = {getattr(r, "path", None) for r in app.routes}
    assert {"/ready", "/health"} <= paths
