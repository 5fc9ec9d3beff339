"""`./dev test`: the test tiers, each its own pytest process. The in-process tiers (app, vllm033,
deploy) run side by side, one pytest process each on the two cores, each tier's output printed whole
when it ends; then the engine tier alone. The first tier that fails ends the run and the tiers
beside it (its exit status is the run's).

    ./dev test                               every tier
    ./dev test tests/app/generate tests/engine/decode/test_faults_aborts.py::test_x
                                             only the tiers those paths are in, each with its paths
                                             (tests/app/vllm/test_differential.py: in both lines' tiers)
    ./dev test -x -k derender                every tier, each with these pytest options

A tier is a folder of tests/ (tests/vllm033 runs on vLLM 0.33's modules, which tests/support/
vllm_wheel.py unpacks from the cached wheel, first on PYTHONPATH; with them the differential,
tests/app/vllm/test_differential.py, with 0.33's allowed list). Options go to every tier run;
a tier that they deselect entirely (`-k`, `-m`) counts as passed and says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
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
    # Runs by itself: real engines and timing-sensitive drains want both cores. Tiers that do not
    # run side by side (each its own pytest process): together they use both cores, alone each one.
    alone: bool = False


# In-process tiers first (most failures show there, in minutes), the engine tier (the slowest) last;
# what each took: docs/testing.md.
TIERS = [
    # The bench's own checks (statistics, scenarios, the figure) need no engine either.
    Tier("app", "tests/app", also=("bench",)),
    # The differential is one module on both lines, each with its own allowed list.
    Tier("vllm033", "tests/vllm033", _vllm033_env, also=("tests/app/vllm/test_differential.py",)),
    Tier("deploy", "tests/deploy"),
    Tier("engine", "tests/engine", alone=True),
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


def _phases(chosen: list[tuple[Tier, list[str]]]) -> list[list[tuple[Tier, list[str]]]]:
    """The chosen tiers in runs: tiers side by side until one that runs alone (in TIERS' order)."""
    phases: list[list[tuple[Tier, list[str]]]] = []
    for entry in chosen:
        if entry[0].alone or not phases or phases[-1][0][0].alone:
            phases.append([entry])
        else:
            phases[-1].append(entry)
    return phases


@dataclass
class _Running:
    tier: Tier
    process: subprocess.Popen
    log: Path | None  # where its output goes while others run beside it; None: straight to ours
    began: float = field(default_factory=time.monotonic)


def _start(tier: Tier, tier_args: list[str], env: dict[str, str], log: Path | None) -> _Running:
    print(f"\n===== tier {tier.name}: pytest {' '.join(tier_args)}", flush=True)
    out = open(log, "wb") if log else None  # noqa: SIM115 (the child holds it; closed with the run)
    # A session of its own: a failing neighbour ends this tier with everything it started.
    process = subprocess.Popen([sys.executable, "-m", "pytest", *tier_args], cwd=ROOT,
                               env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT if out else None,
                               start_new_session=True)
    if out:
        out.close()
    return _Running(tier, process, log)


def _run_phase(phase: list[tuple[Tier, list[str]]], logs: Path, filtered: bool, done: list[str]) -> int:
    """Run a phase's tiers side by side; the first that fails ends the others. Each tier's output
    is printed whole when it ends, so the blocks do not interleave."""
    beside = len(phase) > 1
    if beside:
        print(f"\n===== side by side: {', '.join(tier.name for tier, _ in phase)}", flush=True)
    envs = [tier.env() for tier, _ in phase]  # all before any starts: one may refuse (no 0.33 wheel)
    started = [_start(tier, args, env, logs / f"{tier.name}.log" if beside else None) for (tier, args), env in zip(phase, envs)]
    running = {r.process.pid: r for r in started}
    failed = 0
    while running:
        pid, status, usage = os.wait4(-1, 0)  # rusage: this tier and everything it waited for
        r = running.pop(pid, None)
        if r is None:
            continue
        r.process.returncode = code = os.waitstatus_to_exitcode(status)
        if r.log:
            sys.stdout.write(r.log.read_text(errors="replace"))
        took = f"{r.tier.name} {time.monotonic() - r.began:.0f} s (CPU {usage.ru_utime + usage.ru_stime:.0f} s)"
        if failed and code != 0:
            done.append(f"{took}: stopped")
            continue
        if code == NO_TESTS_COLLECTED and filtered:
            done.append(f"{took}: no test selected by the options")
            continue
        done.append(took + ("" if code == 0 else f": failed ({code})"))
        if code != 0 and not failed:
            failed = code
            for other in running.values():
                os.killpg(other.process.pid, signal.SIGTERM)
    return failed


def run(args: list[str]) -> int:
    filtered = any(arg in ("-k", "-m") or arg.startswith(("-k", "-m")) for arg in args)
    done: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tiers-") as logs:
        for phase in _phases(plan(args)):
            code = _run_phase(phase, Path(logs), filtered, done)
            if code != 0:
                print(f"\n===== tiers: {'; '.join(done)}; stopped at {', '.join(t.name for t, _ in phase)}", flush=True)
                return code
    print(f"\n===== tiers passed: {'; '.join(done)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
