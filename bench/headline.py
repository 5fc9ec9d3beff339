"""The `--headline` report: medians and spreads over interleaved repetitions.

From the per-run records of an interleaved run (each with `cell` and `rep`), per
scenario (a cell and a pair of levels compared: tokens vs tokens, text vs text,
derender stream vs vLLM's coupled chat stream):

- per system (ours, vLLM, the in-process floor): median, min, max and IQR over the
  repetitions of frontend CPU ms/token, output tok/s, TTFT p50, TPOT/request p50, E2E p50;
- per repetition, then summarised the same way: ours ÷ vLLM CPU/token; the overhead above
  the floor, system CPU/token − floor CPU/token (the floor of the same repetition); and the
  ratio ours-overhead ÷ vLLM-overhead; tok/s and TTFT ratios; each server's tok/s ÷ the floor's
  (with the issue #16 target line for 64 streams: ≥ 0.97× the in-process engine);
- the TTFT cells (`prompt_len` > 0: unique prompts per request) in their own table: ours ÷ vLLM
  TTFT p50 and p90 per repetition, and each system's TTFT p50.

Writes OUT/results.md, OUT/headline.json (these aggregates) and the headline plots.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.stats import difference, paired, ratio, spread
from bench.tables import ALL_SCENARIOS_NOTE, fmt, header_lines, scenario_table

COMPARISONS = (("tokens", "tokens"), ("text", "text"), ("derender", "chat"))
FLOOR = ("inproc", "tokens")
METRICS = {
    "cpu_ms_per_token": lambda r: r.get("frontend_cpu_ms_per_token"),
    "output_tok_s": lambda r: r["summary"]["output_tok_s"],
    "ttft_p50_ms": lambda r: r["summary"]["ttft_ms"]["p50"],
    "ttft_p90_ms": lambda r: r["summary"]["ttft_ms"]["p90"],
    "tpot_req_p50_ms": lambda r: r["summary"]["tpot_req_ms"]["p50"],
    "e2e_p50_ms": lambda r: r["summary"]["e2e_ms"]["p50"],
    "foreign_cores": lambda r: r["cpu"].get("foreign_cores"),
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
    keys = {"ours": ("ours", ours_lv), "vllm": ("vllm", vllm_lv), "floor": FLOOR}
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


def ratio_table(rows: list[dict]) -> list[str]:
    lines = [
        "| scenario | frontend CPU/token, ours ÷ vLLM | overhead above the floor, ours ÷ vLLM | ours − floor ms/token | "
        "vLLM − floor ms/token | tok/s, ours ÷ vLLM | TTFT p50, ours ÷ vLLM | tok/s, ours ÷ floor | tok/s, vLLM ÷ floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs_floor = r.get("tok_s_vs_floor") or {}
        lines.append(
            f"| {r['label']} | {sp(r['cpu_ratio'], iqr=True)} | {sp(r['overhead_ratio'], iqr=True)} "
            f"(of medians: {fmt(r['overhead_ratio_of_medians'], 3)}) | {sp(r['overhead_ms_per_token']['ours'], 4)} | "
            f"{sp(r['overhead_ms_per_token']['vllm'], 4)} | {sp(r['tok_s_ratio'])} | {sp(r['ttft_ratio'])} | "
            f"{sp(vs_floor.get('ours'))} | {sp(vs_floor.get('vllm'))} |"
        )
    return lines


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
    lines = [
        "| scenario | requests | TTFT p50, ours ÷ vLLM | TTFT p90, ours ÷ vLLM | ours TTFT p50 ms | vLLM TTFT p50 ms | floor TTFT p50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r["systems"]
        lines.append(
            f"| {r['label']} | {r.get('requests')} | {sp(r['ttft_ratio'])} | {sp(r['ttft_p90_ratio'])} | "
            f"{sp(m['ours']['ttft_p50_ms'], 1)} | {sp(m['vllm']['ttft_p50_ms'], 1)} | {sp(m['floor']['ttft_p50_ms'], 1)} |"
        )
    return lines


def system_table(rows: list[dict]) -> list[str]:
    lines = [
        "| scenario | system | runs | frontend CPU ms/token | output tok/s | TTFT p50 ms | TPOT/request p50 ms | E2E p50 ms | foreign cores |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for name in ("ours", "vllm", "floor"):
            m = r["systems"][name]
            level = {"ours": r["ours_level"], "vllm": r["vllm_level"], "floor": "in-process AsyncLLM"}[name]
            lines.append(
                f"| {r['label']} | {name} ({level}) | {m['cpu_ms_per_token']['n']} | {sp(m['cpu_ms_per_token'], 4)} | "
                f"{sp(m['output_tok_s'], 0)} | {sp(m['ttft_p50_ms'], 1)} | {sp(m['tpot_req_p50_ms'])} | "
                f"{sp(m['e2e_p50_ms'], 0)} | {sp(m['foreign_cores'], 2)} |"
            )
    return lines


def write_headline_report(out: Path, data: dict) -> None:
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
        "Plots: `headline_cpu_per_token.png`, `headline_overhead.png`, `headline_ttft.png`, `headline_throughput.png`"
        + (", `headline_ttft_prompts.png` (the TTFT cells)" if ttft_rows else "")
        + " (bars: medians; error bars: min–max over the repetitions).",
        "",
    ]
    (out / "results.md").write_text("\n".join(lines))
    (out / "headline.json").write_text(json.dumps(all_rows, indent=1))
    from bench.plots import plot_headline, plot_headline_ttft

    plot_headline(out, rows)
    plot_headline_ttft(out, ttft_rows)
