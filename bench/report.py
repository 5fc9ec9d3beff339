"""results.json -> results.md: medians and spreads over the interleaved repetitions.

    python -m bench.report bench/results/<run>     # re-renders <run>/results.md and figure.svg from <run>/results.json

From the per-run records (each with `cell` and `rep`), per scenario (a cell and a pair of
levels compared: tokens vs tokens, text vs text, derender stream vs vLLM's coupled chat stream):

- per system (ours, vLLM, the in-process floor): median, min, max and IQR over the
  repetitions of frontend CPU ms/token, output tok/s, TTFT p50, TPOT/request p50, E2E p50;
- per repetition, then summarised the same way: ours ÷ vLLM CPU/token; the overhead above
  the floor, system CPU/token − floor CPU/token (the floor of the same repetition); and the
  ratio ours-overhead ÷ vLLM-overhead; tok/s and TTFT ratios; each server's tok/s ÷ the floor's
  (with the issue #16 target line for 64 streams: ≥ 0.97× the in-process engine);
- the TTFT cells (`prompt_len` > 0: unique prompts per request) in their own table: ours ÷ vLLM
  TTFT p50 and p90 per repetition, and each system's TTFT p50;
- every run, one line each.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.stats import difference, paired, ratio, spread

COMPARISONS = (("tokens", "tokens"), ("text", "text"), ("derender", "chat"))
FLOOR = ("inproc", "tokens")
FLOOR_NODETOK = ("inproc", "nodetok")  # the floor with detokenize=False (issue #30)
METRICS = {
    "cpu_ms_per_token": lambda r: r.get("frontend_cpu_ms_per_token"),
    "output_tok_s": lambda r: r["summary"]["output_tok_s"],
    "ttft_p50_ms": lambda r: r["summary"]["ttft_ms"]["p50"],
    "ttft_p90_ms": lambda r: r["summary"]["ttft_ms"]["p90"],
    "tpot_req_p50_ms": lambda r: r["summary"]["tpot_req_ms"]["p50"],
    "e2e_p50_ms": lambda r: r["summary"]["e2e_ms"]["p50"],
    "foreign_cores": lambda r: r["cpu"].get("foreign_cores"),
    "ttft_p99_ms": lambda r: r["summary"]["ttft_ms"]["p99"],
    "events_per_token": lambda r: r["summary"].get("events_per_token"),
    "gap_p50_ms": lambda r: (r["summary"].get("event_gap_ms") or {}).get("p50"),
    "gap_p99_ms": lambda r: (r["summary"].get("event_gap_ms") or {}).get("p99"),
    "wakeups_per_step": lambda r: (r.get("server_counters") or {}).get("wakeups_per_step"),
    "writes_per_token": lambda r: (r.get("server_counters") or {}).get("writes_per_token"),
}
PerRep = dict[int, Any]


THROUGHPUT_TARGET = (64, 0.97)  # issue #16: SSE throughput at 64 streams >= 0.97x the in-process engine


def cell_of(r: dict) -> str:
    p = r.get("prompt_len") or 0
    return r.get("cell") or f"{'batch' if r.get('batch') else 'stream'}-L{r['length']}-c{r['concurrency']}" + (f"-p{p}" if p else "")


def valid(r: dict) -> bool:
    """A run counts when every request completed with exactly L tokens and nothing was cut off."""
    s = r["summary"]
    return not s.get("errors") and not s.get("truncated") and r.get("exact_length", True) and s.get("completed") == s.get("requests")


def per_rep(recs: list[dict], system: str, level: str, cell: str, metric: str) -> PerRep:
    fn = METRICS[metric]
    return {r["rep"]: fn(r) for r in recs if (r["system"], r["level"], cell_of(r)) == (system, level, cell) and valid(r)}


def _series(recs: list[dict], system: str, level: str, cell: str) -> dict[str, PerRep]:
    return {m: per_rep(recs, system, level, cell, m) for m in METRICS}


def comparison(recs: list[dict], cell: str, ours_lv: str, vllm_lv: str) -> dict[str, Any] | None:
    """One headline scenario: per-system spreads and per-repetition ratios (None if neither ran)."""
    keys = {"ours": ("ours", ours_lv), "vllm": ("vllm", vllm_lv), "floor": FLOOR, "floor_nodetok": FLOOR_NODETOK}
    if not any(cell_of(r) == cell and (r["system"], r["level"]) in (keys["ours"], keys["vllm"]) for r in recs):
        return None
    s = {name: _series(recs, sys_, lv, cell) for name, (sys_, lv) in keys.items()}
    o, v, f = (s[n]["cpu_ms_per_token"] for n in ("ours", "vllm", "floor"))
    ov_o, ov_v = paired(o, f, difference), paired(v, f, difference)
    med_o, med_v = spread(ov_o.values())["median"], spread(ov_v.values())["median"]
    sample = next(r for r in recs if cell_of(r) == cell)
    prompt_len = sample.get("prompt_len") or 0
    shape = f"{'batch' if sample.get('batch') else 'stream'} c{sample['concurrency']}"
    if prompt_len:
        shape += f", {prompt_len}-token prompts, L{sample['length']}"
    tok_s = {n: s[n]["output_tok_s"] for n in keys}
    return {
        "cell": cell,
        "batch": bool(sample.get("batch")),
        "length": sample["length"],
        "concurrency": sample["concurrency"],
        "prompt_len": prompt_len,
        "requests": sample.get("requests"),
        "ours_level": ours_lv,
        "vllm_level": vllm_lv,
        "label": f"{shape}: {ours_lv} vs {vllm_lv}",
        "systems": {name: {m: spread(vals.values()) for m, vals in s[name].items()} for name in keys},
        "cpu_ratio": spread(paired(o, v, ratio).values()),
        "overhead_ms_per_token": {"ours": spread(ov_o.values()), "vllm": spread(ov_v.values())},
        "overhead_ratio": spread(paired(ov_o, ov_v, ratio).values()),
        "overhead_ratio_of_medians": None if med_o is None or not med_v else round(med_o / med_v, 4),
        "tok_s_ratio": spread(paired(tok_s["ours"], tok_s["vllm"], ratio).values()),
        # output tok/s of each server ÷ the floor's in the same repetition (the issue #16 throughput target)
        "tok_s_vs_floor": {n: spread(paired(tok_s[n], tok_s["floor"], ratio).values()) for n in ("ours", "vllm")},
        # above the floor that does not detokenize: what a tokens-level frontend adds at the least
        "overhead_nodetok_ratio": spread(paired(
            paired(o, s["floor_nodetok"]["cpu_ms_per_token"], difference), paired(v, s["floor_nodetok"]["cpu_ms_per_token"], difference), ratio
        ).values()),  # fmt: skip
        "ttft_ratio": spread(paired(s["ours"]["ttft_p50_ms"], s["vllm"]["ttft_p50_ms"], ratio).values()),
        "ttft_p90_ratio": spread(paired(s["ours"]["ttft_p90_ms"], s["vllm"]["ttft_p90_ms"], ratio).values()),
        "per_rep_cpu_ms_per_token": {"ours": o, "vllm": v, "floor": f},
    }


def aggregate(recs: list[dict]) -> list[dict[str, Any]]:
    """Every headline scenario present in the records: stream cells by concurrency, then batch cells,
    then the TTFT cells (prompt_len > 0)."""
    shapes = {cell_of(r): (bool(r.get("prompt_len")), bool(r.get("batch")), r.get("prompt_len") or 0, r["concurrency"], r["length"]) for r in recs}
    rows = []
    for cell in sorted(shapes, key=shapes.get):
        for ours_lv, vllm_lv in COMPARISONS:
            row = comparison(recs, cell, ours_lv, vllm_lv)
            if row is not None:
                rows.append(row)
    return rows


def sp(x: dict[str, Any], nd: int = 3, iqr: bool = False) -> str:
    """'median [min–max]' (and the IQR) of a spread."""
    if not x or x.get("median") is None:
        return "–"
    s = f"{fmt(x['median'], nd)} [{fmt(x['min'], nd)}–{fmt(x['max'], nd)}]"
    return s + (f" IQR {fmt(x['iqr'], nd)}" if iqr else "")


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: the header, its rule, one line per row."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def ratio_table(rows: list[dict]) -> list[str]:
    header = [
        "scenario", "frontend CPU/token, ours ÷ vLLM", "overhead above the floor, ours ÷ vLLM", "ours − floor ms/token",
        "vLLM − floor ms/token", "tok/s, ours ÷ vLLM", "TTFT p50, ours ÷ vLLM", "tok/s, ours ÷ floor", "tok/s, vLLM ÷ floor",
    ]  # fmt: skip
    out = []
    for r in rows:
        vs_floor, over = r.get("tok_s_vs_floor") or {}, r["overhead_ms_per_token"]
        out.append([
            r["label"], sp(r["cpu_ratio"], iqr=True),
            f"{sp(r['overhead_ratio'], iqr=True)} (of medians: {fmt(r['overhead_ratio_of_medians'], 3)})",
            sp(over["ours"], 4), sp(over["vllm"], 4), sp(r["tok_s_ratio"]), sp(r["ttft_ratio"]),
            sp(vs_floor.get("ours")), sp(vs_floor.get("vllm")),
        ])  # fmt: skip
    return md_table(header, out)


def throughput_target_lines(rows: list[dict]) -> list[str]:
    """The issue #16 target, "SSE throughput at 64 streams >= 0.97x the in-process engine", per server."""
    c, target = THROUGHPUT_TARGET
    out = []
    for r in rows:
        if r["batch"] or r["prompt_len"] or r["concurrency"] != c or r["ours_level"] != "tokens":
            continue
        vs = r["tok_s_vs_floor"]
        med = vs["ours"]["median"]
        met = "–" if med is None else ("met (median)" if med >= target else "not met (median)")
        out.append(
            f"- **Target: SSE throughput at {c} streams ≥ {target}× the in-process engine** ({r['label']}, L{r['length']}, "
            f"{r.get('requests')} requests): output tok/s **ours ÷ floor {sp(vs['ours'])}**, vLLM ÷ floor {sp(vs['vllm'])} "
            f"(per-repetition ratios, median [min–max], n = {vs['ours']['n']}): {met}"
        )
    return out


def ttft_table(rows: list[dict]) -> list[str]:
    """The TTFT cells (unique prompts per request): ours ÷ vLLM TTFT p50/p90 and each system's p50."""
    header = ["scenario", "requests", "TTFT p50, ours ÷ vLLM", "TTFT p90, ours ÷ vLLM", "ours TTFT p50 ms", "vLLM TTFT p50 ms", "floor TTFT p50 ms"]
    out = [
        [r["label"], str(r.get("requests")), sp(r["ttft_ratio"]), sp(r["ttft_p90_ratio"]), *(sp(r["systems"][n]["ttft_p50_ms"], 1) for n in ("ours", "vllm", "floor"))]
        for r in rows
    ]
    return md_table(header, out)


def system_table(rows: list[dict]) -> list[str]:
    header = ["scenario", "system", "runs", "frontend CPU ms/token", "output tok/s", "TTFT p50 ms", "TPOT/request p50 ms", "E2E p50 ms", "foreign cores"]
    out = []
    for r in rows:
        for name in ("ours", "vllm", "floor"):
            m = r["systems"][name]
            level = {"ours": r["ours_level"], "vllm": r["vllm_level"], "floor": "in-process AsyncLLM"}[name]
            out.append([
                r["label"], f"{name} ({level})", str(m["cpu_ms_per_token"]["n"]), sp(m["cpu_ms_per_token"], 4), sp(m["output_tok_s"], 0),
                sp(m["ttft_p50_ms"], 1), sp(m["tpot_req_p50_ms"]), sp(m["e2e_p50_ms"], 0), sp(m["foreign_cores"], 2),
            ])  # fmt: skip
    return md_table(header, out)


def write_report(out: Path) -> None:
    from bench.report_targets import latency_table, target_lines  # they format with this module's helpers

    data = json.loads((out / "results.json").read_text())
    meta, recs = data["meta"], data["scenarios"]
    all_rows = aggregate(recs)
    rows = [r for r in all_rows if not r["prompt_len"]]
    ttft_rows = [r for r in all_rows if r["prompt_len"]]
    n = meta.get("repeat")
    title = f"# decode-server benchmarks: headline run ({n} interleaved repetitions), {meta['started']}"
    batch_c = "/".join(str(c) for c in sorted({r["concurrency"] for r in rows if r["batch"]})) or "no"
    lines = header_lines(meta, recs, title)
    lines.append(f"- resident memory after start-up, GiB: {meta.get('rss_gib')}; available with all up: {meta.get('available_gib_all_up')} GiB")
    lines += [
        "",
        "## Headline ratios",
        "",
        f"Each figure is the median [min–max] over the repetitions (IQR: interquartile range). Ratios and overheads are "
        f"computed per repetition, from runs made back to back (A B, then B A), then summarised. Overhead above the floor = "
        f"the system's frontend CPU/token − the in-process AsyncLLM's CPU/token in the same repetition."
        + (f" Batch: {batch_c} concurrent `stream: false` requests; their TTFT is the whole response." if batch_c != "no" else ""),
        "",
        *ratio_table(rows),
        "",
        "tok/s ÷ floor: the server's output tok/s ÷ the in-process AsyncLLM's in the same repetition.",
        *(["", *throughput_target_lines(rows)] if throughput_target_lines(rows) else []),
        "",
    ]
    lines += [
        "## Issue #30's targets (medians)",
        "",
        *target_lines(rows),
        "",
        "## Latency, events and ours' stream counters",
        "",
        "Medians over the repetitions. Gap: between two events that carry tokens, at the client. The floor not "
        "detokenizing is AsyncLLM with `detokenize=False`. Wake-ups per engine step: stream writers woken per pass of "
        "the one-pass consumer; writes per token: socket writes ÷ output tokens (`decode_server_stream_*_total`).",
        "",
        *latency_table(rows),
        "",
    ]
    if ttft_rows:
        lines += [
            "## TTFT",
            "",
            "Tokens level, streams; every request has its own prompt (its first tokens are the digits of its prompt length, "
            "repetition and sequence number, then filler text; the same token ids for every system), so vLLM's prefix cache "
            "(on by default) cannot make prefill free. TTFT = request sent → first event carrying an output token; ratios "
            "per repetition, then median [min–max].",
            "",
            *ttft_table(ttft_rows),
            "",
        ]
    lines += [
        "## Per system",
        "",
        *system_table(all_rows),
        "",
        "## All runs",
        "",
        ALL_SCENARIOS_NOTE,
        "",
        *scenario_table(recs),
        "",
    ]
    (out / "results.md").write_text("\n".join(lines))


ALL_SCENARIOS_NOTE = (
    "TPOT per token: each token-carrying event's gap since the previous one ÷ its tokens, counted once per token "
    "over every stream (the inter-token latency a client sees; when events arrive in bursts its p50 drops towards 0). "
    "TPOT per request: (last token time − first token time) ÷ (tokens after the first event), one value per request. "
    "Frontend CPU is the API-server process only (user+sys), engine processes excluded. "
    "Engine tok/s is vLLM's `vllm:generation_tokens_total` delta ÷ wall (in-process: tokens received). "
    "Foreign cores: CPU other processes on the machine used during the scenario."
)


def fmt(x: Any, nd: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        return f"{x:.{nd}f}"
    return str(x)


def header_lines(meta: dict, recs: list[dict], title: str) -> list[str]:
    """Title, machine, engine, wall time, contention and errors of a run."""
    foreign = [r["cpu"].get("foreign_cores") or 0 for r in recs]
    busy = [r["id"] for r in recs if (r["cpu"].get("foreign_cores") or 0) > 0.3]
    m = meta["machine"]
    lines = [
        title,
        "",
        f"- machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['mem_gib']} GiB; Python {m['python']}, vLLM {m['vllm']}; "
        f"commit {m.get('git_commit')}",
        f"- engine (every system): `{' '.join(meta['engine_flags'])}`; servers add `{' '.join(meta['tool_flags'])}`; "
        f"`VLLM_CPU_OMP_THREADS_BIND={meta['bind']}`; prompt {meta['prompt_tokens']} tokens "
        f"(matches vLLM's /render: {fmt(meta.get('render_matches_vllm'))})",
        f"- wall time {meta.get('duration_s')} s; server start-up s: {meta.get('startup_s')}; load average at start "
        f"{meta['loadavg_start']}, at end {meta.get('loadavg_end')}",
        f"- contention: other processes used {fmt(statistics.mean(foreign) if foreign else None)} cores on average during the "
        f"scenarios (max {fmt(max(foreign) if foreign else None)}); scenarios with > 0.3 foreign cores: "
        f"{', '.join(busy) if busy else 'none'}",
    ]
    if meta.get("errors"):
        lines.append(f"- **errors**: {meta['errors']}")
    return lines


def scenario_table(recs: list[dict]) -> list[str]:
    header = [
        "system", "scenario", "L", "c", "ok/n", "TTFT p50 / p99 ms", "TPOT per token p50 / p90 / p99 ms", "TPOT per request p50 / p99 ms",
        "E2E p50 / p90 / p99 ms", "tokens/event", "out tok/s", "engine tok/s", "frontend CPU ms/token", "frontend cores", "foreign cores",
    ]  # fmt: skip
    out = []
    for r in recs:
        x = r["summary"]
        name = r["level"] + (" (batch)" if r.get("batch") else "") + ("" if r.get("rep") is None else f", rep {r['rep']}")
        flags = (" ⚠ truncated" if x.get("truncated") else "") + ("" if r.get("exact_length", True) else " ⚠ lengths")
        out.append([
            r["system"], name + flags, str(r["length"]), str(r["concurrency"]), f"{x['completed']}/{x['requests']}",
            f"{fmt(x['ttft_ms']['p50'], 1)} / {fmt(x['ttft_ms']['p99'], 1)}",
            " / ".join(fmt(x["tpot_ms"][p]) for p in ("p50", "p90", "p99")),
            f"{fmt(x['tpot_req_ms']['p50'])} / {fmt(x['tpot_req_ms']['p99'])}",
            " / ".join(fmt(x["e2e_ms"][p], 0) for p in ("p50", "p90", "p99")),
            fmt(x.get("tokens_per_event")), fmt(x["output_tok_s"], 0), fmt(r.get("engine_tok_s"), 0),
            fmt(r.get("frontend_cpu_ms_per_token"), 3), fmt(r.get("frontend_cores")), fmt(r["cpu"].get("foreign_cores")),
        ])  # fmt: skip
    return md_table(header, out)


if __name__ == "__main__":
    from bench.figure import write_figure

    write_report(Path(sys.argv[1]))
    write_figure(Path(sys.argv[1]))
