"""The server's arguments are written once and follow the base into every overlay (issue 32 item 5).

The model and its parser flags live in one component (deploy/components/model-qwen3, listed by the
base); the common flags in the base's pools. The llm-d overlay copies the decode pool's args to its
prefill pool (a replacement), the cpu-demo overlay removes the model and the KV transfer with
checked JSON-patch removals. Values that differ per pool or overlay are env variables the kubelet
expands into the args. These tests render the real trees, and copies of deploy/ with the base edited,
to show an edit reaching (or failing the build of) every overlay.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.deploy_render import BASE, CPU_DEMO, DEPLOY, LLM_D, kustomize_cmd, load_docs, named, pod_spec, render

MODEL_COMPONENT = DEPLOY / "components" / "model-qwen3"
SERVER = "decode-server"


@pytest.fixture(autouse=True)
def _needs_kustomize():
    if kustomize_cmd() is None:
        pytest.fail("kustomize or kubectl is needed to build the base (it lists a component) and the overlays")


def server(deployment: dict) -> dict:
    (c,) = [c for c in pod_spec(deployment)["containers"] if c["name"] == SERVER]
    return c


def args_of(docs: list[dict], pool: str) -> list[str]:
    return server(named(docs, "Deployment", f"decode-server-{pool}"))["args"]


def env_values(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def expanded(c: dict) -> list[str]:
    """The args after the kubelet's $(VAR) expansion; an unresolved reference fails."""
    values = env_values(c)
    out = []
    for a in c["args"]:
        for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
            assert var in values, f"$({var}) in the args has no literal env value in the container: {sorted(values)}"
        out.append(re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values[m[1]], a))
    return out


def component_patches() -> tuple[str, list[str]]:
    """What the model component sets: MODEL (strategic merge) and the flags it appends (JSON patch)."""
    kust = yaml.safe_load((MODEL_COMPONENT / "kustomization.yaml").read_text())
    model, flags = None, []
    for p in kust["patches"]:
        body = yaml.safe_load(p["patch"])
        if isinstance(body, list):
            assert "llm-d.ai/role=decode" in p["target"]["labelSelector"]
            assert all(op["op"] == "add" and op["path"].endswith("/args/-") for op in body)
            flags += [op["value"] for op in body]
        else:
            (c,) = body["spec"]["template"]["spec"]["containers"]
            (model,) = [e["value"] for e in c["env"] if e["name"] == "MODEL"]
    assert model and flags
    return model, flags


def test_model_and_parser_flags_are_written_once():
    """As a list item or a value (an argument or an env value; prose such as runbook text aside),
    the model and the parser flags appear in the model component only, and the common flags in the
    base's two pools only (the overlays change env values, not args)."""
    model, flags = component_patches()
    parser_words = [model, *(f for f in flags if f.startswith("--"))]
    common = ["--shutdown-timeout", "--log-format", "--kv-transfer-config", "--tokens-only"]
    seen: dict[str, set[str]] = {w: set() for w in [*parser_words, *common]}
    for path in DEPLOY.rglob("*.y*ml"):
        for line in path.read_text().splitlines():
            for w in seen:
                if re.match(rf"\s*(?:-|value:)\s+['\"]?{re.escape(w)}['\"]?\s*$", line):
                    seen[w].add(str(path.relative_to(DEPLOY)))
    for w in parser_words:
        assert seen[w] == {"components/model-qwen3/kustomization.yaml"}, (w, seen[w])
    pools = {"base/decode-deployment.yaml", "base/prefill-deployment.yaml"}
    for w in common[:2]:
        assert seen[w] == pools, (w, seen[w])
    # ... and in the cpu-demo's checked removal (a JSON-patch `test` value), which names what it removes.
    assert seen["--kv-transfer-config"] == pools | {"overlays/cpu-demo/kustomization.yaml"}
    assert seen["--tokens-only"] == {"base/prefill-deployment.yaml"}


def test_base_pools_agree():
    """The base's prefill pool runs the decode pool's args less the model's parser flags, plus
    --tokens-only; both get MODEL from the component."""
    docs = render(BASE)
    model, flags = component_patches()
    decode, prefill = args_of(docs, "decode"), args_of(docs, "prefill")
    assert decode[-len(flags):] == flags, "the component's flags end the decode pool's args"
    assert prefill == [*decode[:-len(flags)], "--tokens-only"]
    for pool in ("decode", "prefill"):
        c = server(named(docs, "Deployment", f"decode-server-{pool}"))
        assert env_values(c)["MODEL"] == model
        assert not [v for v in re.findall(r"\$\((\w+)\)", " ".join(c["args"])) if v.startswith("DECODE_SERVER_")]


def test_llm_d_runs_the_base_args_in_both_pools():
    base, llm_d = render(BASE), render(LLM_D)
    decode, prefill = args_of(llm_d, "decode"), args_of(llm_d, "prefill")
    assert decode == args_of(base, "decode"), "the overlay changes env values, not the base's args"
    assert prefill == decode, "the prefill pool copies the decode pool's args (same parsers, same fingerprint)"
    d = expanded(server(named(llm_d, "Deployment", "decode-server-decode")))
    p = expanded(server(named(llm_d, "Deployment", "decode-server-prefill")))
    assert d[d.index("--port") + 1] == "8200" and p[p.index("--port") + 1] == "8000"
    assert '"kv_role":"kv_consumer"' in d[d.index("--kv-transfer-config") + 1]
    assert '"kv_role":"kv_producer"' in p[p.index("--kv-transfer-config") + 1]
    assert "--tokens-only" not in p


def test_cpu_demo_runs_the_base_args_less_model_and_kv_transfer():
    base = args_of(render(BASE), "decode")
    assert base[:3] == ["$(MODEL)", "--kv-transfer-config", "$(KV_TRANSFER_CONFIG)"]
    c = server(named(render(CPU_DEMO), "Deployment", "decode-server-decode"))
    assert c["args"] == base[3:]
    assert not {"MODEL", "KV_TRANSFER_CONFIG"} & set(env_values(c))
    expanded(c)


# ---------------------------------------------------------------- edits to a copy of deploy/


def _build(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*kustomize_cmd(), str(tree)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def deploy_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    return copy


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} not found once in {path}"
    path.write_text(text.replace(old, new))


def test_an_edit_to_the_base_reaches_every_overlay(deploy_copy):
    """A flag added to the base's decode pool, and another model in the component, show up in the
    cpu-demo's pod and in both llm-d pools."""
    _edit(deploy_copy / "base" / "decode-deployment.yaml", "            - --log-format\n",
          "            - --max-num-seqs\n            - \"64\"\n            - --log-format\n")
    _edit(deploy_copy / "components" / "model-qwen3" / "kustomization.yaml", "value: Qwen/Qwen3-8B", "value: Qwen/Qwen3-32B")
    for overlay, pools in (("cpu-demo", ["decode"]), ("llm-d", ["decode", "prefill"])):
        out = _build(deploy_copy / "overlays" / overlay)
        assert out.returncode == 0, out.stderr
        docs = load_docs(out.stdout)
        for pool in pools:
            c = server(named(docs, "Deployment", f"decode-server-{pool}"))
            assert "--max-num-seqs" in c["args"] and c["args"][c["args"].index("--max-num-seqs") + 1] == "64", (overlay, pool)
            if overlay == "llm-d":
                assert expanded(c)[0] == "Qwen/Qwen3-32B"


def test_moving_the_args_cpu_demo_removes_fails_its_build(deploy_copy):
    """cpu-demo removes the model and the KV transfer by position, each removal checked by a JSON
    patch `test`: a base whose args no longer start with them fails the build, loudly."""
    _edit(deploy_copy / "base" / "decode-deployment.yaml", "            - $(MODEL)\n",
          "            - --max-num-seqs\n            - \"64\"\n            - $(MODEL)\n")
    out = _build(deploy_copy / "overlays" / "cpu-demo")
    assert out.returncode != 0 and "test failed" in out.stderr, out.stderr[-2000:]
    # The llm-d overlay does not depend on positions: the same edit reaches it.
    out = _build(deploy_copy / "overlays" / "llm-d")
    assert out.returncode == 0, out.stderr
    assert "--max-num-seqs" in args_of(load_docs(out.stdout), "prefill")
