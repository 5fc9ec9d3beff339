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
from bench.workload import WARM_REP, Workload

MIN_AVAILABLE_GIB = 3.0  # free memory required before each engine start (three engines share 24 GiB)
LEVEL_RANK = {"tokens": 0, "text": 1, "derender": 2, "chat": 2}
SYSTEM_ORDER = ("ours", "vllm")


def rep_order(cell: list[Scenario], rep: int) -> list[Scenario]:
    """One repetition of a cell: level pairs in order, ours/vllm alternating which goes first per
    repetition, the floor first on even repetitions and last on odd ones. A cell of one run per
    system is rotated instead (floor ours vllm, ours vllm floor, vllm floor ours, …): with the
    floor at alternate ends, ours would always run between the other two."""
    first = SYSTEM_ORDER[rep % 2]
    floor = [sc for sc in cell if sc.system == "inproc"]
    http = sorted((sc for sc in cell if sc.system != "inproc"), key=lambda sc: (LEVEL_RANK.get(sc.level, 9), sc.system != first))
    if len(http) == 2 and len(floor) == 1:
        seq = sorted(cell, key=lambda sc: ("inproc", *SYSTEM_ORDER).index(sc.system))
        seq = seq[rep % 3 :] + seq[: rep % 3]
    else:
        seq = floor + http if rep % 2 == 0 else http + floor
    return [replace(sc, rep=rep) for sc in seq]


def schedule(blocks: dict[str, list[Scenario]], repeat: int) -> list[Scenario]:
    """Every run of an interleaved plan, in order (cells in plan order, repetitions within a cell)."""
    cells: dict[str, list[Scenario]] = {}
    for scs in blocks.values():
        for sc in scs:
            cells.setdefault(sc.cell, []).append(sc)
    return [sc for cell in cells.values() for rep in range(repeat) for sc in rep_order(cell, rep)]


# The wall-time model of an interleaved run, calibrated on the 2026-12-01 headline run (2 154 s for 95
# runs, mean 0.33 foreign cores: 1 597 s of runs, 301 s of quiet waits = the whole quiet budget, 194 s
# of start-ups) and the issue #16 cells' sanity run (1 repetition, 397 s, 1.08 foreign cores): start-up
# per system, warm-ups and stops, per run a small overhead + output tokens at the engine's rate for that
# concurrency + prompt tokens at the prefill rate, plus the quiet waits (at most quiet_wait_s per run and
# quiet_budget_s per run of the mode: on a busy machine the headline's cells before issue #16 spend it all).
STARTUP_S = 65.0
FIXED_S = 40.0  # tokenizer, warm-ups, stopping the fleet
RUN_OVERHEAD_S = 0.5
STREAM_TOK_S = {1: 330.0, 4: 900.0, 8: 1150.0, 32: 1350.0, 64: 1300.0}
BATCH_TOK_S = {32: 1700.0}
PREFILL_TOK_S = 20000.0  # unique prompts (the floor prefilled 50 k tok/s, the servers ~10 k under 1.7 foreign cores)


def _rate(table: dict[int, float], c: int) -> float:
    """Output tok/s at concurrency c: the table's value, linear in between, flat outside."""
    ks = sorted(table)
    if c <= ks[0]:
        return table[ks[0]]
    for lo, hi in zip(ks, ks[1:]):
        if c <= hi:
            return table[lo] + (table[hi] - table[lo]) * (c - lo) / (hi - lo)
    return table[ks[-1]]


def run_estimate_s(sc: Scenario) -> float:
    """Estimated seconds for one run of a scenario, its quiet wait not included."""
    rate = _rate(BATCH_TOK_S if sc.batch else STREAM_TOK_S, sc.concurrency)
    return RUN_OVERHEAD_S + sc.length * sc.requests / rate + sc.prompt_len * sc.requests / PREFILL_TOK_S


def estimate_s(runs: list[Scenario], n_systems: int, quiet_wait_s: float = 5.0, quiet_budget_s: float = 300.0) -> float:
    """Estimated wall time of an interleaved run on a busy machine (every quiet wait runs to its cap)."""
    quiet = min(quiet_budget_s, quiet_wait_s * len(runs))
    return STARTUP_S * n_systems + FIXED_S + quiet + sum(run_estimate_s(sc) for sc in runs)


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


def warm_floor(runner: Runner, worker: systems.InprocWorker, scenarios: list[Scenario], L: int) -> None:
    """The floor's long-prompt warm-ups (its worker warmed the rest): as Runner.warm gives the servers."""
    for p in sorted({sc.prompt_len for sc in scenarios if sc.prompt_len}):
        sc = Scenario("inproc", "tokens", L, 2, 2, rep=WARM_REP, prompt_len=p)
        item = worker.run({**asdict(sc), "name": f"warmup-{sc.id}", "time_limit_s": 120, "quiet_wait_s": 0}, 300)
        if item["summary"]["errors"]:
            raise RuntimeError(f"warm-up of inproc/{sc.id} failed: {item['summary']['first_error']}")


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
    est = estimate_s(runs, len(blocks), runner.quiet_wait_s, pl.quiet_budget_s)
    meta["estimated_s"] = round(est)
    runner.log(f"interleaved: {len(runs)} runs ({pl.repeat} repetitions), {tokens} output tokens, estimated {est / 60:.1f} min")
    fleet = Fleet(runner, model_dir, pl.flags, wl, list(blocks))
    try:
        fleet.start(meta)
        for name, member in fleet.members.items():
            if name == "vllm":
                meta["render_matches_vllm"] = check_render(member.url, wl)
            if runner.warm_up:
                if name == "inproc":
                    warm_floor(runner, member, blocks[name], wl.warm_length)
                else:
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
