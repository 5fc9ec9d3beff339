"""The headline's scenarios and their interleaved schedule.

A scenario is one system at one level on one load shape (a "cell": stream/batch, output
length L, concurrency c, prompt length). Per cell, repetition r runs every scenario of the
cell once:

    rep 0:  floor, ours tokens, vllm tokens, ours text, vllm text, ours derender, vllm chat
    rep 1:  vllm tokens, ours tokens, vllm text, ours text, vllm chat, ours derender, floor
    rep 2:  as rep 0, ...

so the two systems compared with each other run back to back (A B, then B A, so neither
always goes first) and the floor of the same repetition is at most a few runs away.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

LENGTH = 512
REPEAT = 5
STREAM_CONCS = (8, 32)
BATCH_CONCS = (32,)
# Issue #16: SSE throughput at 64 streams vs the floor, and TTFT cells (tokens level, streams,
# unique prompts per request so vLLM's prefix cache cannot make prefill free).
C64 = (64, 64, 256)  # concurrency, requests (one wave), output tokens
TTFT_CELLS = (  # concurrency, requests, output tokens, prompt tokens
    (32, 256, 8, 256),  # a high request rate of short prompts: 8 x c requests of 8 tokens each
    (4, 8, 8, 8000),  # 8k-token prompts: prefill dominates (8000 + 24 max tokens < max-model-len 10240)
)
SYSTEMS = ("ours", "vllm", "inproc")
# The floor's levels: "tokens" is AsyncLLM as the servers drive it (detokenizing); "nodetok" is the
# same requests with `detokenize=False`, the least a tokens-level frontend must do (issue #30).
LEVEL_RANK = {"nodetok": -1, "tokens": 0, "text": 1, "derender": 2, "chat": 2}
STREAM_LEVELS = (("tokens", "tokens"), ("text", "text"), ("derender", "chat"))  # (ours, vLLM's) per stream cell
HTTP_ORDER = ("ours", "vllm")


@dataclass(frozen=True)
class Scenario:
    system: str  # ours | vllm | inproc (the floor)
    level: str  # tokens | text | derender (ours) | chat (vllm's coupled chat stream)
    length: int
    concurrency: int
    requests: int
    batch: bool = False  # stream: false (one JSON response per request)
    rep: int | None = None  # repetition index
    # 0: the 262-token chat prompt, the same for every request; N > 0: an N-token filler prompt,
    # unique per (N, repetition, request) and identical for every system (bench.workload.unique_prompt)
    prompt_len: int = 0

    @property
    def _shape(self) -> str:
        return f"L{self.length}-c{self.concurrency}" + (f"-p{self.prompt_len}" if self.prompt_len else "")

    @property
    def cell(self) -> str:
        """The load shape, shared by every system and level compared with each other."""
        return f"{'batch' if self.batch else 'stream'}-{self._shape}"

    @property
    def id(self) -> str:
        base = f"{self.system}-{self.level}-{self._shape}"
        return base + ("-batch" if self.batch else "") + ("" if self.rep is None else f"-r{self.rep}")


def headline() -> dict[str, list[Scenario]]:
    """Per system: 8, 32 and 64 concurrent streams (tokens, text, derender vs coupled chat; the
    floor with and without detokenizing) and 32 concurrent batch requests (tokens, text); then
    the TTFT cells (tokens level only)."""
    blocks: dict[str, list[Scenario]] = {s: [] for s in SYSTEMS}
    shapes = [(LENGTH, c, 2 * c, False) for c in STREAM_CONCS] + [(LENGTH, c, 2 * c, True) for c in BATCH_CONCS]
    shapes.insert(len(STREAM_CONCS), (C64[2], C64[0], C64[1], False))
    for length, c, n, batch in shapes:
        levels = STREAM_LEVELS[:2] if batch else STREAM_LEVELS
        blocks["ours"] += [Scenario("ours", a, length, c, n, batch) for a, _ in levels]
        blocks["vllm"] += [Scenario("vllm", b, length, c, n, batch) for _, b in levels]
        floors = ("tokens",) if batch else ("nodetok", "tokens")
        blocks["inproc"] += [Scenario("inproc", lv, length, c, n, batch) for lv in floors]
    for c, n, length, prompt_len in TTFT_CELLS:
        for system in SYSTEMS:
            blocks[system].append(Scenario(system, "tokens", length, c, n, prompt_len=prompt_len))
    return blocks


def lengths() -> list[int]:
    """Every output length the headline's scripts need."""
    return sorted({LENGTH, C64[2], *(length for _, _, length, _ in TTFT_CELLS)})


def filtered(blocks: dict[str, list[Scenario]], systems_csv: str | None, only: str | None) -> dict[str, list[Scenario]]:
    """Blocks kept by `--systems a,b` and scenarios whose id matches `--only REGEX`."""
    if systems_csv:
        wanted = set(systems_csv.split(","))
        blocks = {k: v for k, v in blocks.items() if k in wanted}
    if only:
        rx = re.compile(only)
        blocks = {k: [sc for sc in v if rx.search(sc.id)] for k, v in blocks.items()}
    return {k: v for k, v in blocks.items() if v}


def rep_order(cell: list[Scenario], rep: int) -> list[Scenario]:
    """One repetition of a cell: level pairs in order, ours/vllm alternating which goes first per
    repetition, the floor first on even repetitions and last on odd ones. A cell of one run per
    system is rotated instead (floor ours vllm, ours vllm floor, vllm floor ours, …): with the
    floor at alternate ends, ours would always run between the other two."""
    first = HTTP_ORDER[rep % 2]
    floor = sorted((sc for sc in cell if sc.system == "inproc"), key=lambda sc: LEVEL_RANK[sc.level])
    http = sorted((sc for sc in cell if sc.system != "inproc"), key=lambda sc: (LEVEL_RANK.get(sc.level, 9), sc.system != first))
    if len(http) == 2 and len(floor) == 1:
        seq = sorted(cell, key=lambda sc: ("inproc", *HTTP_ORDER).index(sc.system))
        seq = seq[rep % 3 :] + seq[: rep % 3]
    else:
        seq = floor + http if rep % 2 == 0 else http + floor
    return [replace(sc, rep=rep) for sc in seq]


def schedule(blocks: dict[str, list[Scenario]], repeat: int) -> list[Scenario]:
    """Every run, in order (cells in plan order, repetitions within a cell)."""
    cells: dict[str, list[Scenario]] = {}
    for scs in blocks.values():
        for sc in scs:
            cells.setdefault(sc.cell, []).append(sc)
    return [sc for cell in cells.values() for rep in range(repeat) for sc in rep_order(cell, rep)]


# The wall-time model, calibrated on the 2026-12-01 headline run (2 154 s for 95 runs, mean 0.33
# foreign cores: 1 597 s of runs, 301 s of quiet waits = the whole quiet budget, 194 s of start-ups)
# and the issue #16 cells' sanity run (1 repetition, 397 s, 1.08 foreign cores).
STARTUP_S = 65.0
FIXED_S = 40.0  # tokenizer, warm-ups, stopping the systems
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


def estimate_s(runs: list[Scenario], n_systems: int, quiet_wait_s: float, quiet_budget_s: float) -> float:
    """Estimated wall time on a busy machine (every quiet wait runs to its cap)."""
    quiet = min(quiet_budget_s, quiet_wait_s * len(runs))
    return STARTUP_S * n_systems + FIXED_S + quiet + sum(run_estimate_s(sc) for sc in runs)
