"""`python -m bench.run --headline [--repeat N]`: interleaved repetitions on a noisy machine.

All systems of the plan are started once and kept up together (ours, vLLM's own server,
and the in-process floor as a `bench.inproc --bench-serve` worker), so a repetition
does not pay an engine start. Then, per cell (a load shape: stream/batch, L, c), for
each repetition 0..N-1, every scenario of the cell runs once:

    rep 0:  floor, ours tokens, vllm tokens, ours text, vllm text, ours derender, vllm chat
    rep 1:  vllm tokens, ours tokens, vllm text, ours text, vllm chat, ours derender, floor
    rep 2:  as rep 0, ...

so the two systems compared with each other run back to back (A B, then B A, so
neither always goes first) and the floor of the same repetition is at most a few
runs away. Every run is kept (no retries): the spread over the repetitions is the
noise measure. Idle systems cost little (vLLM's engine stops busy-polling ~1 s after
its last request) and count as "foreign" CPU in each record, like anyone else's work.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from bench import systems
from bench.measure import CpuMeter, available_gib, tree_rss_gib
from bench.plans import Plan, Scenario
from bench.runner import Runner, check_render
from bench.workload import Workload

MIN_AVAILABLE_GIB = 3.0  # free memory required before each engine start (three engines share 24 GiB)
LEVEL_RANK = {"tokens": 0, "text": 1, "derender": 2, "chat": 2}
SYSTEM_ORDER = ("ours", "vllm")


def rep_order(cell: list[Scenario], rep: int) -> list[Scenario]:
    """One repetition of a cell: level pairs in order, ours/vllm alternating which goes first per
    repetition, the floor first on even repetitions and last on odd ones."""
    first = SYSTEM_ORDER[rep % 2]
    floor = [sc for sc in cell if sc.system == "inproc"]
    http = sorted((sc for sc in cell if sc.system != "inproc"), key=lambda sc: (LEVEL_RANK.get(sc.level, 9), sc.system != first))
    seq = floor + http if rep % 2 == 0 else http + floor
    return [replace(sc, rep=rep) for sc in seq]


def schedule(blocks: dict[str, list[Scenario]], repeat: int) -> list[Scenario]:
    """Every run of an interleaved plan, in order (cells in plan order, repetitions within a cell)."""
    cells: dict[str, list[Scenario]] = {}
    for scs in blocks.values():
        for sc in scs:
            cells.setdefault(sc.cell, []).append(sc)
    return [sc for cell in cells.values() for rep in range(repeat) for sc in rep_order(cell, rep)]


class Fleet:
    """The plan's systems, all up at once."""

    def __init__(self, runner: Runner, model_dir: Path, flags: list[str], wl: Workload, names: list[str]):
        self.runner = runner
        self.members: dict[str, systems.Server | systems.InprocWorker] = {}
        logs = runner.tmp / "logs"
        for name in names:
            if name == "ours":
                self.members[name] = systems.ours(model_dir, logs, runner.bind, flags)
            elif name == "vllm":
                self.members[name] = systems.vllms_own(model_dir, logs, runner.bind, flags)
            elif name == "inproc":
                wl_path = runner.tmp / "workload.json"
                wl_path.write_text(wl.to_json())
                self.members[name] = systems.InprocWorker(model_dir, logs, runner.bind, flags, wl_path, runner.tmp / "inproc-work")
            else:
                raise ValueError(f"no interleaved form of block {name!r}")

    def start(self, meta: dict) -> None:
        """Start one at a time (start-up compiles on both cores), each only if memory allows."""
        meta.setdefault("rss_gib", {})
        for name, member in self.members.items():
            free = available_gib()
            if free < MIN_AVAILABLE_GIB:
                raise RuntimeError(f"only {free} GiB of memory available before starting {name} (need {MIN_AVAILABLE_GIB})")
            self.runner.log(f"starting {name} ({free} GiB available)")
            member.start()
            meta["startup_s"][name] = member.startup_s
            meta["rss_gib"][name] = tree_rss_gib(member.pid)
            self.runner.log(f"{name} up after {member.startup_s} s (pid {member.pid}, {meta['rss_gib'][name]} GiB resident)")
        meta["available_gib_all_up"] = available_gib()

    def stop(self) -> None:
        for member in reversed(list(self.members.values())):
            try:
                member.stop()
            except Exception as e:  # stop the others anyway
                self.runner.log(f"stopping {member.name} failed: {e}")

    def alive(self, name: str) -> bool:
        proc = self.members[name].proc
        return proc is not None and proc.poll() is None


def _run_floor(runner: Runner, worker: systems.InprocWorker, sc: Scenario) -> None:
    quiet = runner.quiet(CpuMeter(worker.pid))
    item = worker.run({**asdict(sc), "name": sc.id, "time_limit_s": runner.time_limit_s, "quiet_wait_s": 0}, runner.time_limit_s + 180)
    runner.record(sc, None, item["cpu"], item["engine_tokens"], quiet, summary=item["summary"])


def run_interleaved(runner: Runner, pl: Plan, blocks: dict[str, list[Scenario]], wl: Workload, model_dir: Path, meta: dict) -> None:
    """Start every block's system, run the interleaved schedule, stop them; errors go to meta['errors']."""
    runs = schedule(blocks, pl.repeat)
    meta["repeat"] = pl.repeat
    meta["schedule"] = [sc.id for sc in runs]
    tokens = sum(sc.length * sc.requests for sc in runs)
    runner.log(f"interleaved: {len(runs)} runs ({pl.repeat} repetitions), {tokens} output tokens")
    fleet = Fleet(runner, model_dir, pl.flags, wl, list(blocks))
    try:
        fleet.start(meta)
        for name, member in fleet.members.items():
            if name == "vllm":
                meta["render_matches_vllm"] = check_render(member.url, wl)
            if name != "inproc" and runner.warm_up:
                runner.warm(member, wl, blocks[name])
        for i, sc in enumerate(runs):
            if not fleet.alive(sc.system):
                raise RuntimeError(f"{sc.system} is no longer running:\n{fleet.members[sc.system].log_tail()}")
            runner.log(f"run {i + 1}/{len(runs)}: {sc.id}")
            member = fleet.members[sc.system]
            try:
                if sc.system == "inproc":
                    _run_floor(runner, member, sc)
                else:
                    runner.run_http(member, wl, sc)
            except Exception as e:  # one failed run must not lose the others
                runner.log(f"{sc.id} failed: {e}")
                meta["errors"].append(f"{sc.id}: {str(e)[:2000]}")
    finally:
        fleet.stop()
