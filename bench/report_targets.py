"""results.md's issue #30 sections: each target met or missed by how much, and what a client sees
(events per token, gaps between events, TTFT) beside both floors and ours' stream counters."""

from __future__ import annotations

from bench.report import fmt, md_table

TARGETS = {"stream": 0.75, "batch": 0.7, "overhead": 0.5}  # issue #30: CPU/token, ours ÷ vLLM


def ours_vs_vllm(r: dict, metric: str, nd: int = 2) -> str:
    """'ours / vLLM' medians of one metric."""
    return " / ".join(fmt(r["systems"][n][metric]["median"], nd) for n in ("ours", "vllm"))


def latency_table(rows: list[dict]) -> list[str]:
    """What a client sees and what ours' stream counters say, per scenario (medians over the repetitions)."""
    header = [
        "scenario", "events/token, ours / vLLM", "gap between events p50, ours / vLLM ms", "gap p99, ours / vLLM ms",
        "TTFT p50, ours / vLLM ms", "TTFT p99, ours / vLLM ms", "floor CPU ms/token, detokenizing / not",
        "ours: wake-ups per engine step", "ours: writes per token",
    ]  # fmt: skip
    out = []
    for r in rows:
        fl, nd = r["systems"]["floor"], r["systems"]["floor_nodetok"]
        ours = r["systems"]["ours"]
        out.append([
            r["label"], ours_vs_vllm(r, "events_per_token", 3), ours_vs_vllm(r, "gap_p50_ms"), ours_vs_vllm(r, "gap_p99_ms"),
            ours_vs_vllm(r, "ttft_p50_ms", 1), ours_vs_vllm(r, "ttft_p99_ms", 1),
            f"{fmt(fl['cpu_ms_per_token']['median'], 4)} / {fmt(nd['cpu_ms_per_token']['median'], 4)}",
            fmt(ours["wakeups_per_step"]["median"]), fmt(ours["writes_per_token"]["median"], 3),
        ])  # fmt: skip
    return md_table(header, out)


def _verdict(value: float | None, limit: float, at_most: bool = True) -> str:
    if value is None:
        return "not measured"
    ok = value <= limit if at_most else value >= limit
    return "met" if ok else f"missed by {fmt(abs(value - limit), 3)}"


def target_lines(rows: list[dict]) -> list[str]:
    """Issue #30's targets, scenario by scenario, on the medians: met, or missed by how much."""
    out = []
    for r in rows:
        kind = "batch" if r["batch"] else "stream"
        o, v = r["systems"]["ours"], r["systems"]["vllm"]
        over = r["overhead_ms_per_token"]["ours"]["median"]
        checks = [
            f"CPU/token ÷ vLLM {fmt(r['cpu_ratio']['median'], 3)} ≤ {TARGETS[kind]}: {_verdict(r['cpu_ratio']['median'], TARGETS[kind])}",
            # a ratio of overheads means nothing once ours is below the floor
            "ours below the floor: met" if over is not None and over <= 0 else
            f"overhead ÷ vLLM's {fmt(r['overhead_ratio']['median'], 3)} ≤ {TARGETS['overhead']}: "
            f"{_verdict(r['overhead_ratio']['median'], TARGETS['overhead'])}",
        ]  # fmt: skip
        if not r["batch"]:
            e_o, e_v = o["events_per_token"]["median"], v["events_per_token"]["median"]
            diff = None if e_o is None or e_v is None else abs(e_o - e_v)
            checks.append(f"events/token within ±0.02 of vLLM's: {_verdict(diff, 0.02)}")
            for metric, name in (("gap_p99_ms", "gap p99"), ("ttft_p50_ms", "TTFT p50")):
                a, b = o[metric]["median"], v[metric]["median"]
                checks.append(f"{name} ≤ vLLM's: {_verdict(None if a is None or b is None else a - b, 0.0)}")
        out.append(f"- {r['label']}: " + "; ".join(checks))
    return out
