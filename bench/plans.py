"""The scenarios of each `python -m bench.run` mode, as a typed Plan.

A Plan names, per block (a system started once: `ours`, `vllm`, `inproc`), the
scenarios to run on it, plus the mode's bounds. `--headline` is interleaved: all
three blocks are up at once and every scenario runs `repeat` times, alternating
between systems (bench.interleave).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bench import systems

# A scenario during which other processes kept more than this many cores busy is re-run once,
# if it is short; at most MAX_RETRIES per run. Quiet waits are capped per run too.
RETRY_FOREIGN_CORES = 0.5
RETRY_MAX_WALL_S = 30.0
MAX_RETRIES = 8
QUIET_BUDGET_S = 120.0
MODES = ("smoke", "quick", "full", "headline")

HEADLINE_LENGTH = 512
HEADLINE_REPEAT = 5
HEADLINE_STREAM_CONCS = (8, 32)
HEADLINE_BATCH_CONCS = (32,)
# Issue #16: SSE throughput at 64 streams vs the floor (one wave of 64 L512 requests), and TTFT cells
# (tokens level, streams, unique prompts per request so vLLM's prefix cache cannot make prefill free):
# (concurrency, requests, output tokens, prompt tokens).
HEADLINE_C64 = (64, 64, 256)  # concurrency, requests (one wave), output tokens (as the quick mode's c64 cell)
HEADLINE_TTFT_CELLS = (
    (32, 256, 8, 256),  # a high request rate of short prompts: 8 x c requests of 8 tokens each
    (4, 8, 8, 8000),  # 8k-token prompts: prefill dominates (8000 + 24 max tokens < max-model-len 10240)
)


@dataclass(frozen=True)
class Scenario:
    system: str  # ours | vllm | rfc | rfc-split | inproc | mixed
    level: str  # tokens | text | derender | text_lp20 | chat | rfc | alone | mixed
    length: int
    concurrency: int
    requests: int
    batch: bool = False  # stream: false (one JSON response per request)
    rep: int | None = None  # repetition index in an interleaved run
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


@dataclass
class Plan:
    """A mode's scenarios per block, and its bounds."""

    mode: str
    lengths: list[int]
    blocks: dict[str, list[Scenario]]
    flags: list[str]
    time_limit_s: float
    quiet_wait_s: float
    quiet_budget_s: float = QUIET_BUDGET_S
    retries: int = MAX_RETRIES
    warm: bool = True
    repeat: int = 1  # > 1: interleaved repetitions (headline)
    warm_length: int | None = None  # warm-up requests' length (None: the shortest of >= 64 tokens)
    interleaved: bool = False

    def scenarios(self) -> list[Scenario]:
        return [sc for scs in self.blocks.values() for sc in scs]

    def filtered(self, systems_csv: str | None, only: str | None) -> dict[str, list[Scenario]]:
        """Blocks kept by `--systems a,b` and scenarios whose id matches `--only REGEX`."""
        blocks = self.blocks
        if systems_csv:
            wanted = set(systems_csv.split(","))
            blocks = {k: v for k, v in blocks.items() if k in wanted}
        if only:
            import re

            rx = re.compile(only)
            blocks = {k: [sc for sc in v if rx.search(sc.id)] for k, v in blocks.items()}
        return {k: v for k, v in blocks.items() if v}


def _cells(lengths, concs, requests_c1: dict[int, int], max_tokens_per_cell: int | None = None) -> Iterator[tuple[int, int, int]]:
    for L in lengths:
        for c in concs:
            if max_tokens_per_cell and L * c > max_tokens_per_cell:
                continue
            yield L, c, (requests_c1.get(L, 1) if c == 1 else c)


def _smoke() -> Plan:
    return Plan(
        "smoke",
        lengths=[128],
        blocks={"ours": [Scenario("ours", "derender", 128, 2, 4)]},
        time_limit_s=30,
        quiet_wait_s=0,
        retries=0,
        warm=False,
        # A functional check, not a measurement: skip torch.compile (~15-25 s of start-up).
        flags=systems.engine_flags(max_num_seqs=8, max_model_len=4096, kv_bytes=256 * 1024**2) + ["--enforce-eager"],
    )


def _quick() -> Plan:
    cells = [(256, 1, 2), (256, 8, 8), (2048, 1, 1), (2048, 8, 8)]
    vllm = [Scenario("vllm", lv, L, c, n) for lv in ("tokens", "text", "chat") for L, c, n in cells]
    vllm.append(Scenario("vllm", "tokens", 256, 64, 64))
    rfc = [Scenario("rfc", "rfc", L, c, n) for L, c, n in [(256, 1, 2), (256, 8, 8), (2048, 1, 1)]]
    rfc += [Scenario("rfc-split", "rfc", L, c, n) for L, c, n in [(256, 1, 2), (2048, 1, 1)]]
    ours = [Scenario("ours", lv, L, c, n) for lv in ("tokens", "text", "derender", "text_lp20") for L, c, n in cells]
    ours += [Scenario("ours", "derender", 8192, 1, 1), Scenario("ours", "tokens", 256, 64, 64)]
    mixed = [Scenario("mixed", "alone", 2048, 8, 8), Scenario("mixed", "mixed", 2048, 8, 8)]
    inproc = [Scenario("inproc", "tokens", L, c, n) for L, c, n in cells] + [Scenario("inproc", "tokens", 256, 64, 64)]
    return Plan(
        "quick",
        lengths=[256, 2048, 8192],
        blocks={"vllm": vllm + rfc, "ours": ours + mixed, "inproc": inproc},
        time_limit_s=150,
        quiet_wait_s=10,
        flags=systems.engine_flags(),
    )


def _full() -> Plan:
    lengths, concs = [256, 2048, 8192], [1, 8, 32, 64]
    cells = list(_cells(lengths, concs, {256: 3, 2048: 1, 8192: 1}, max_tokens_per_cell=64 * 2048))
    vllm = [Scenario("vllm", lv, L, c, n) for lv in ("tokens", "text", "chat") for L, c, n in cells]
    # Per-chunk derender replays the whole output per chunk (O(n^2) parser work): only small sizes fit.
    rfc = [Scenario("rfc", "rfc", L, c, n) for L, c, n in [(256, 1, 3), (256, 8, 8), (256, 32, 32), (256, 64, 64), (2048, 1, 1)]]
    rfc += [Scenario("rfc-split", "rfc", L, c, n) for L, c, n in [(256, 1, 3), (256, 8, 8), (2048, 1, 1)]]
    ours = [Scenario("ours", lv, L, c, n) for lv in ("tokens", "text", "derender", "text_lp20") for L, c, n in cells]
    mixed = [Scenario("mixed", lv, 2048, c, c) for c in (8, 64) for lv in ("alone", "mixed")]
    inproc = [Scenario("inproc", "tokens", L, c, n) for L, c, n in cells]
    return Plan(
        "full",
        lengths=lengths,
        blocks={"vllm": vllm + rfc, "ours": ours + mixed, "inproc": inproc},
        time_limit_s=400,
        quiet_wait_s=30,
        quiet_budget_s=600,
        flags=systems.engine_flags(),
    )


def _headline(repeat: int) -> Plan:
    """8 and 32 concurrent streams (tokens, text, derender vs coupled chat) and 32 concurrent batch
    requests (tokens, text); then (issue #16) 64 streams and the TTFT cells (tokens level, unique
    prompts); each against the in-process floor; `repeat` interleaved repetitions."""
    L = HEADLINE_LENGTH
    ours: list[Scenario] = []
    vllm: list[Scenario] = []
    inproc: list[Scenario] = []
    shapes = [(c, False) for c in HEADLINE_STREAM_CONCS] + [(c, True) for c in HEADLINE_BATCH_CONCS]
    for c, batch in shapes:
        n = 2 * c  # two waves of requests per run
        levels = (("tokens", "tokens"), ("text", "text")) + (() if batch else (("derender", "chat"),))
        ours += [Scenario("ours", a, L, c, n, batch) for a, _ in levels]
        vllm += [Scenario("vllm", b, L, c, n, batch) for _, b in levels]
        inproc.append(Scenario("inproc", "tokens", L, c, n, batch))
    # Issue #16, after the cells above (whose runs and order are unchanged): 64 streams, one wave
    # (the ">= 0.97x the in-process engine" throughput target), and the TTFT cells.
    extra = [(*HEADLINE_C64, 0), *HEADLINE_TTFT_CELLS]
    for c, n, length, prompt_len in extra:
        for system, blk in (("ours", ours), ("vllm", vllm), ("inproc", inproc)):
            blk.append(Scenario(system, "tokens", length, c, n, prompt_len=prompt_len))
    return Plan(
        "headline",
        lengths=sorted({L, HEADLINE_C64[2], *(length for _, _, length, _ in HEADLINE_TTFT_CELLS)}),
        blocks={"ours": ours, "vllm": vllm, "inproc": inproc},
        time_limit_s=300,
        quiet_wait_s=5,
        quiet_budget_s=300,
        retries=0,  # the repetitions are the noise control; every run is kept
        repeat=repeat,
        interleaved=True,
        warm_length=L,  # as before the issue #16 cells (whose 8- and 256-token scripts are shorter)
        # All three engines are up at once: a 512 MiB KV cache each (~1M tokens of this 2-layer model's
        # cache at 2 layers x K+V x 1 KV head x 64 x 2 bytes = 512 B/token; 20x what 64 x 790 tokens
        # need, 32x the 4 x 8024 of the 8k-prompt cell) keeps three engines well inside the 24 GiB machine.
        flags=systems.engine_flags(kv_bytes=512 * 1024**2),
    )


def plan(mode: str, repeat: int | None = None) -> Plan:
    """The Plan of a mode (`repeat` only applies to the interleaved headline mode)."""
    if mode == "smoke":
        return _smoke()
    if mode == "quick":
        return _quick()
    if mode == "full":
        return _full()
    if mode == "headline":
        return _headline(HEADLINE_REPEAT if repeat is None else repeat)
    raise ValueError(mode)
