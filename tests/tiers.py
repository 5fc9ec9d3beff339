"""`./dev test`: the test tiers, each its own pytest process, fastest first; the first tier that fails
ends the run (its exit status is the run's).

    ./dev test                               every tier
    ./dev test tests/app/generate tests/engine/decode/test_faults.py::test_x
                                             only the tiers those paths are in, each with its paths
                                             (tests/app/vllm/test_differential.py: in both lines' tiers)
    ./dev test -x -k derender                every tier, each with these pytest options

A tier is a folder of tests/ (tests/vllm033 runs on vLLM 0.33's modules, which tests/support/
vllm_wheel.py unpacks from the cached wheel, first on PYTHONPATH; with them the differential,
tests/app/vllm/test_differential.py, with 0.33's allowed list). Options go to every tier run;
a tier that they deselect entirely (`-k`, `-m`) counts as passed and says so."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_TESTS_COLLECTED = 5  # pytest's exit status


def _vllm033_env() -> dict[str, str]:
    from decode_server.compat import VLLM_LINE

    if VLLM_LINE == "0.33":  # this venv's own vLLM is the line
        return {}
    from tests.support import vllm_wheel

    try:
        paths = vllm_wheel.ensure()
    except vllm_wheel.WheelUnavailable as e:
        raise SystemExit(f"tiers: vLLM {vllm_wheel.VERSION}'s wheel is needed for the vllm033 tier: {e}") from e
    return {
        "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)]),
        "VLLM_TARGET_DEVICE": "cpu",
        # vLLM keys its model-class cache by class name, not version: a cache shared with 0.32 is
        # stale for each line in turn, and a miss inspects the class in a subprocess (~10 s).
        "VLLM_CACHE_ROOT": str(vllm_wheel.CACHE / "vllm-cache-root"),
    }


@dataclass
class Tier:
    name: str
    folder: str
    env: Callable[[], dict[str, str]] = field(default=dict)
    also: tuple[str, ...] = ()  # modules of another folder it runs too, on its own vLLM


# In-process tiers first (most failures show there, in minutes), the engine tier (the slowest) last;
# what each took: docs/testing.md.
TIERS = [
    Tier("app", "tests/app"),
    # The differential is one module on both lines, each with its own allowed list.
    Tier("vllm033", "tests/vllm033", _vllm033_env, also=("tests/app/vllm/test_differential.py",)),
    Tier("deploy", "tests/deploy"),
    Tier("engine", "tests/engine"),
]


def _path_of(arg: str) -> Path | None:
    """The file or folder a positional argument names (a node id's file), if it is one."""
    if arg.startswith("-"):
        return None
    path = Path(arg.split("::", 1)[0])
    return path.resolve() if path.exists() else None


def plan(args: list[str]) -> list[tuple[Tier, list[str]]]:
    """Each tier to run with its pytest arguments: the paths inside it (all of it when no path names
    a tier's folder) and every other argument."""
    paths = {arg: p for arg in args if (p := _path_of(arg)) is not None}
    options = [arg for arg in args if arg not in paths]
    chosen: list[tuple[Tier, list[str]]] = []
    placed: set[str] = set()
    for tier in TIERS:
        folder = (ROOT / tier.folder).resolve()
        homes = [folder, *((ROOT / also).resolve() for also in tier.also)]
        inside = [arg for arg, p in paths.items() if any(p == home or home in p.parents for home in homes)]
        covering = [arg for arg, p in paths.items() if p in folder.parents]  # `tests`, `.`
        placed.update(inside, covering)
        if paths and not inside and not covering:
            continue
        chosen.append((tier, [*([tier.folder, *tier.also] if not paths or covering else inside), *options]))
    if set(paths) - placed:
        raise SystemExit(f"tiers: not in a tier's folder: {' '.join(sorted(set(paths) - placed))} "
                         f"(tiers: {', '.join(t.folder for t in TIERS)})")
    return chosen


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(args: list[str]) -> int:
    filtered = any(arg in ("-k", "-m") or arg.startswith(("-k", "-m")) for arg in args)
    done: list[str] = []
    for tier, tier_args in plan(args):
        env = {**os.environ, **tier.env()}
        print(f"\n===== tier {tier.name}: pytest {' '.join(tier_args)}", flush=True)
        began, cpu = time.monotonic(), _cpu_s()
        code = subprocess.call([sys.executable, "-m", "pytest", *tier_args], cwd=ROOT, env=env)
        took = f"{tier.name} {time.monotonic() - began:.0f} s (CPU {_cpu_s() - cpu:.0f} s)"
        if code == NO_TESTS_COLLECTED and filtered:
            done.append(f"{took}: no test selected by the options")
            continue
        done.append(took + ("" if code == 0 else f": failed ({code})"))
        if code != 0:
            print(f"\n===== tiers: {'; '.join(done)}; stopped at {tier.name}", flush=True)
            return code
    print(f"\n===== tiers passed: {'; '.join(done)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
