"""The shape of the house (issue #11): floors only point down, no stage reaches sideways, rooms stay small."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "decode_server"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 350

# The floor of each module; an import may only point at a lower floor (protocol/ is floor 0).
FLOORS = {
    "decode_server": 1,
    "decode_server.config": 1,
    "decode_server.frontend_flags": 1,
    "decode_server.errors": 2,
    "decode_server.access_log": 3,
    "decode_server.metrics": 3,
    "decode_server.fingerprint": 3,
    "decode_server.openapi": 3,
    "decode_server.auth": 2,
    "decode_server.demo_model": 3,
    "decode_server.replay": 3,
    "decode_server.pd_proxy": 3,
    "decode_server.sse": 3,
    "decode_server.engine": 3,
    "decode_server.peers": 3,
    "decode_server.lora": 3,
    "decode_server.remote_prefill": 3,
    "decode_server.pipeline": 4,
    "decode_server.pipeline.steps": 4,
    "decode_server.pipeline.tokens": 5,
    "decode_server.pipeline.logprobs": 5,
    "decode_server.pipeline.derender_plan": 5,
    "decode_server.pipeline.token_aligned_text": 5,
    "decode_server.pipeline.derender": 6,
    "decode_server.pipeline.wire": 5,
    "decode_server.validate": 6,
    "decode_server.service": 7,
    "decode_server.request_record": 7,
    "decode_server.routes": 8,
    "decode_server.app": 9,
    "decode_server.server": 9,
    "decode_server.scale_out": 10,
    "decode_server.cli": 11,
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_every_module_has_a_floor():
    assert set(_modules()) == set(FLOORS), "add new modules to FLOORS (and to the README's layout section)"


def test_imports_only_point_down_a_floor():
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        for target in _imports(path):
            if target in FLOORS and target != name and FLOORS[target] >= FLOORS[name] and target != "decode_server":
                wrong.append(f"{name} (floor {FLOORS[name]}) imports {target} (floor {FLOORS[target]})")
    assert not wrong, "\n".join(sorted(wrong))


def test_protocol_imports_nothing_of_vllm_or_the_server():
    for path in (ROOT / "protocol").rglob("*.py"):
        bad = {i for i in _imports(path) if i.split(".")[0] in ("vllm", "decode_server", "torch")}
        assert not bad, f"{path.name} imports {bad}"


def test_no_function_over_60_lines_and_no_file_over_350():
    too_long = []
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text().count("\n")
        if lines > MAX_FILE_LINES:
            too_long.append(f"{path.name}: {lines} lines")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.name}:{node.name}: {length} lines")
    assert not too_long, "\n".join(too_long)
