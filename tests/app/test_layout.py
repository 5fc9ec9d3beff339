"""The shape of the house: rooms by what changes together, floors only point down, rooms stay small.

Floors (low to high): protocol/ → the base (config, errors, compat) → runtime/ (engine, LoRA, peers,
metrics, bookkeeping) → generate/pipeline/ (the stages) → generate/ (admission, service) → http/
(the app and its handlers) → tools/ (separate programs) → process/ (CLI, server, scale-out).
Inside a room, imports may go any way but round (no cycles).
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "decode_server"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 350

BASE = {"decode_server", "decode_server.config", "decode_server.errors", "decode_server.compat"}
# The room of a module is the longest prefix found here; its floor is the number.
ROOMS = {
    "decode_server": 1,  # the base: only the modules in BASE may live at the top level
    "decode_server.runtime": 2,
    "decode_server.generate.pipeline": 3,
    "decode_server.generate": 4,
    "decode_server.http": 5,
    "decode_server.tools": 6,
    "decode_server.process": 7,
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _room(module: str) -> str:
    return max((r for r in ROOMS if module == r or module.startswith(r + ".")), key=len)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _internal_imports() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {t for t in _imports(path) if t in modules and t != name} for name, path in modules.items()}


def test_the_top_level_holds_only_the_base():
    stray = sorted(m for m in _modules() if _room(m) == "decode_server" and m not in BASE)
    assert not stray, f"put these in a room (runtime/, generate/, http/, tools/, process/): {stray}"


def test_imports_only_point_down_a_floor():
    wrong = []
    for name, targets in _internal_imports().items():
        for target in targets:
            if target == "decode_server":
                continue
            if _room(target) != _room(name) and ROOMS[_room(target)] >= ROOMS[_room(name)]:
                wrong.append(f"{name} ({_room(name)}) imports {target} ({_room(target)})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycle_inside_a_room():
    graph = {
        name: {t for t in targets if _room(t) == _room(name) and t != "decode_server" and not name.startswith(t + ".")}
        for name, targets in _internal_imports().items()
    }
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as e:
        raise AssertionError(f"import cycle: {e.args[1]}") from None


STAGES = {f"decode_server.generate.pipeline.{s}" for s in ("tokens", "logprobs", "derender", "stats", "wire")}


def test_no_stage_reaches_sideways_into_another():
    """A stage sees only the step types and its own helpers; the service stacks the stages."""
    wrong = [f"{name} imports {t}" for name, targets in _internal_imports().items() if name in STAGES for t in targets if t in STAGES]
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
