"""results.json -> results.md (tables, issue #5 targets) and PNG plots.

    python -m bench.report bench/results/<dir>
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

SERIES = {
    ("ours", "tokens"): "ours: tokens",
    ("ours", "text"): "ours: text",
    ("ours", "derender"): "ours: derender stream",
    ("ours", "text_lp20"): "ours: text + top-20 logprobs",
    ("vllm", "tokens"): "vLLM: generate tokens",
    ("vllm", "text"): "vLLM: generate text",
    ("vllm", "chat"): "vLLM: coupled chat stream",
    ("rfc", "rfc"): "RFC: vLLM generate + per-chunk /derender, same server",
    ("rfc-split", "rfc"): "RFC: vLLM generate + per-chunk /derender on a 2nd server",
    ("inproc", "tokens"): "in-process AsyncLLM (no HTTP)",
}
STYLE = {
    ("ours", "tokens"): ("tab:blue", "-"),
    ("ours", "text"): ("tab:blue", "--"),
    ("ours", "derender"): ("tab:blue", "-."),
    ("ours", "text_lp20"): ("tab:blue", ":"),
    ("vllm", "tokens"): ("tab:orange", "-"),
    ("vllm", "text"): ("tab:orange", "--"),
    ("vllm", "chat"): ("tab:orange", "-."),
    ("rfc", "rfc"): ("tab:red", "-."),
    ("rfc-split", "rfc"): ("tab:red", ":"),
    ("inproc", "tokens"): ("tab:green", "-"),
}


def _f(x: Any, nd: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        return f"{x:.{nd}f}"
    return str(x)


def _idx(recs: list[dict]) -> dict[tuple, dict]:
    return {(r["system"], r["level"], r["length"], r["concurrency"]): r for r in recs}


def _cpu(r: dict | None) -> float | None:
    return None if r is None else r.get("frontend_cpu_ms_per_token")


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def evaluate_targets(recs: list[dict]) -> list[dict[str, Any]]:
    """Each issue #5 target with the measured ratio(s) next to it."""
    ix = _idx(recs)
    cells = sorted({(r["length"], r["concurrency"]) for r in recs})
    out: list[dict[str, Any]] = []

    def pairwise(a_key, b_key, metric, cells_filter=None):
        rows = []
        for L, c in cells:
            if cells_filter and not cells_filter(L, c):
                continue
            a, b = ix.get((*a_key, L, c)), ix.get((*b_key, L, c))
            if a is None or b is None:
                continue
            r = _ratio(metric(a), metric(b))
            if r is not None:
                rows.append((L, c, r))
        return rows

    def detail(rows, fmt="{:.2f}"):
        return "; ".join(f"L{L} c{c}: " + fmt.format(r) for L, c, r in rows)

    # 1. ours frontend CPU/token <= 0.5x vLLM's own server at the same level.
    for ours_lv, vllm_lv, what in (("text", "text", "text vs vLLM generate text"), ("derender", "chat", "derender stream vs vLLM coupled chat stream")):
        rows = pairwise(("ours", ours_lv), ("vllm", vllm_lv), _cpu)
        worst = max((r for *_, r in rows), default=None)
        out.append({
            "target": f"frontend CPU/token, ours {what}: ≤ 0.5×",
            "measured": f"worst {_f(worst)}× (median {_f(statistics.median([r for *_, r in rows]) if rows else None)}×)",
            "met": None if worst is None else worst <= 0.5,
            "detail": detail(rows),
        })
    rows = pairwise(("ours", "tokens"), ("vllm", "tokens"), _cpu)
    if rows:
        out.append({
            "target": "(context) frontend CPU/token, ours tokens vs vLLM generate tokens",
            "measured": f"worst {_f(max(r for *_, r in rows))}×",
            "met": None,
            "detail": detail(rows),
        })
    # 2. inline derender >= 50x cheaper CPU/token than generate + per-chunk derender at 2048 tokens,
    #    and lower E2E p50 at every concurrency; for both RFC set-ups.
    for rfc_sys, how in (("rfc", "derender on the same vLLM server"), ("rfc-split", "derender on a second vLLM server")):
        if not any(r["system"] == rfc_sys for r in recs):
            continue
        rows = pairwise((rfc_sys, "rfc"), ("ours", "derender"), _cpu, lambda L, c: L == 2048)
        best = min((r for *_, r in rows), default=None)
        tpe = {(r["length"], r["concurrency"]): r["summary"].get("tokens_per_event") for r in recs if r["system"] == rfc_sys}
        out.append({
            "target": f"RFC ({how}) CPU/token ÷ ours inline derender, at 2048 tokens: ≥ 50×",
            "measured": f"{_f(best, 1)}×" if best is not None else "not measured",
            "met": None if best is None else best >= 50,
            "detail": detail(pairwise((rfc_sys, "rfc"), ("ours", "derender"), _cpu), "{:.1f}×")
            + " (tokens per /derender call: " + ", ".join(f"L{L} c{c}: {_f(v)}" for (L, c), v in sorted(tpe.items())) + ")",
        })
        rows = pairwise(("ours", "derender"), (rfc_sys, "rfc"), lambda r: r["summary"]["e2e_ms"]["p50"])
        worst = max((r for *_, r in rows), default=None)
        out.append({
            "target": f"E2E p50, ours derender ÷ RFC ({how}): < 1 at every measured concurrency",
            "measured": f"worst {_f(worst, 3)}×",
            "met": None if worst is None else worst < 1,
            "detail": detail(rows, "{:.3f}"),
        })
    # 3. derender CPU/token at 8192 <= 1.2x at 256 (same concurrency).
    rows = []
    for c in sorted({c for _, c in cells}):
        a, b = ix.get(("ours", "derender", 8192, c)), ix.get(("ours", "derender", 256, c))
        r = _ratio(_cpu(a), _cpu(b))
        if r is not None:
            rows.append((8192, c, r))
    worst = max((r for *_, r in rows), default=None)
    out.append({
        "target": "ours derender CPU/token at 8192 ÷ at 256 tokens: ≤ 1.2×",
        "measured": f"{_f(worst)}×" if worst is not None else "not measured",
        "met": None if worst is None else worst <= 1.2,
        "detail": detail(rows),
    })
    # 4. TPOT p50 derender <= 1.03x tokens level.
    # Per-request TPOT: on 2 shared cores SSE events often arrive in bursts, which puts the
    # per-token p50 near 0 and makes its ratio meaningless; the per-request mean gap is robust.
    rows = pairwise(("ours", "derender"), ("ours", "tokens"), lambda r: r["summary"]["tpot_req_ms"]["p50"])
    worst = max((r for *_, r in rows), default=None)
    out.append({
        "target": "TPOT p50 (per request), ours derender ÷ ours tokens: ≤ 1.03×",
        "measured": f"worst {_f(worst, 3)}× (median {_f(statistics.median([r for *_, r in rows]) if rows else None, 3)}×)",
        "met": None if worst is None else worst <= 1.03,
        "detail": detail(rows, "{:.3f}"),
    })
    # 5. tokens p99 TPOT with 50% derender traffic <= 1.05x alone.
    rows = []
    for L, c in cells:
        alone, mixed = ix.get(("mixed", "alone", L, c)), ix.get(("mixed", "mixed", L, c))
        if alone and mixed:
            tok_mixed = (mixed["summary"].get("by_label") or {}).get("tokens")
            if tok_mixed:
                r = _ratio(tok_mixed["tpot_ms"]["p99"], alone["summary"]["tpot_ms"]["p99"])
                if r is not None:
                    rows.append((L, c, r))
    worst = max((r for *_, r in rows), default=None)
    out.append({
        "target": "tokens-level TPOT p99 (per token) with 50% derender streams ÷ alone: ≤ 1.05×",
        "measured": f"worst {_f(worst, 3)}×" if worst is not None else "not measured",
        "met": None if worst is None else worst <= 1.05,
        "detail": detail(rows, "{:.3f}"),
    })
    # 6. SSE throughput at 64 streams >= 0.95x the in-process engine.
    rows = pairwise(("ours", "tokens"), ("inproc", "tokens"), lambda r: r["summary"]["output_tok_s"], lambda L, c: c == 64)
    worst = min((r for *_, r in rows), default=None)
    extra = pairwise(("vllm", "tokens"), ("inproc", "tokens"), lambda r: r["summary"]["output_tok_s"], lambda L, c: c == 64)
    out.append({
        "target": "output tokens/s at 64 streams, ours SSE tokens ÷ in-process AsyncLLM: ≥ 0.95×",
        "measured": f"{_f(worst, 3)}×" if worst is not None else "not measured",
        "met": None if worst is None else worst >= 0.95,
        "detail": detail(rows, "{:.3f}") + (f" (vLLM generate tokens: {detail(extra, '{:.3f}')})" if extra else ""),
    })
    return out


def scenario_table(recs: list[dict]) -> list[str]:
    lines = [
        "| system | scenario | L | c | ok/n | TTFT p50 / p99 ms | TPOT per token p50 / p90 / p99 ms | TPOT per request p50 / p99 ms | E2E p50 / p90 / p99 ms | tokens/event | out tok/s | engine tok/s | frontend CPU ms/token | frontend cores | foreign cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        s = r["summary"]
        blocks = [(r["level"], s)]
        for lb, sub in sorted((s.get("by_label") or {}).items()):
            blocks.append((f"{r['level']} → {lb} streams", sub))
        for i, (name, x) in enumerate(blocks):
            first = i == 0
            flags = (" ⚠ truncated" if s.get("truncated") else "") + ("" if r.get("exact_length", True) else " ⚠ lengths")
            lines.append(
                f"| {r['system'] if first else ''} | {name}{flags if first else ''} | {r['length']} | {r['concurrency']} | "
                f"{x['completed']}/{x['requests']} | {_f(x['ttft_ms']['p50'], 1)} / {_f(x['ttft_ms']['p99'], 1)} | "
                f"{_f(x['tpot_ms']['p50'])} / {_f(x['tpot_ms']['p90'])} / {_f(x['tpot_ms']['p99'])} | "
                f"{_f(x['tpot_req_ms']['p50'])} / {_f(x['tpot_req_ms']['p99'])} | "
                f"{_f(x['e2e_ms']['p50'], 0)} / {_f(x['e2e_ms']['p90'], 0)} / {_f(x['e2e_ms']['p99'], 0)} | "
                f"{_f(x.get('tokens_per_event'))} | {_f(x['output_tok_s'], 0)} | {_f(r.get('engine_tok_s'), 0) if first else ''} | "
                f"{_f(r.get('frontend_cpu_ms_per_token'), 3) if first else ''} | {_f(r.get('frontend_cores')) if first else ''} | "
                f"{_f(r['cpu'].get('foreign_cores')) if first else ''} |"
            )
    return lines


def write_report(out: Path) -> None:
    data = json.loads((out / "results.json").read_text())
    meta, recs = data["meta"], data["scenarios"]
    targets = evaluate_targets(recs)
    foreign = [r["cpu"].get("foreign_cores") or 0 for r in recs]
    busy = [r["id"] for r in recs if (r["cpu"].get("foreign_cores") or 0) > 0.3]
    m = meta["machine"]
    lines = [
        f"# decode-server benchmarks: {meta['mode']} run, {meta['started']}",
        "",
        f"- machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['mem_gib']} GiB; Python {m['python']}, vLLM {m['vllm']}; "
        f"commit {m.get('git_commit')}",
        f"- engine (every system): `{' '.join(meta['engine_flags'])}`; servers add `{' '.join(meta['tool_flags'])}`; "
        f"`VLLM_CPU_OMP_THREADS_BIND={meta['bind']}`; prompt {meta['prompt_tokens']} tokens "
        f"(matches vLLM's /render: {_f(meta.get('render_matches_vllm'))})",
        f"- wall time {meta.get('duration_s')} s; server start-up s: {meta.get('startup_s')}; load average at start "
        f"{meta['loadavg_start']}, at end {meta.get('loadavg_end')}",
        f"- contention: other processes used {_f(statistics.mean(foreign) if foreign else None)} cores on average during the "
        f"scenarios (max {_f(max(foreign) if foreign else None)}); scenarios with > 0.3 foreign cores: "
        f"{', '.join(busy) if busy else 'none'}",
    ]
    if meta.get("errors"):
        lines.append(f"- **errors**: {meta['errors']}")
    lines += ["", "## Issue #5 targets", "", "| target | measured | met? | per cell |", "|---|---|---|---|"]
    for t in targets:
        met = "–" if t["met"] is None else ("✅ yes" if t["met"] else "❌ no")
        lines.append(f"| {t['target']} | {t['measured']} | {met} | {t['detail']} |")
    lines += [
        "",
        "## All scenarios",
        "",
        "TPOT per token: each token-carrying event's gap since the previous one ÷ its tokens, counted once per token "
        "over every stream (the inter-token latency a client sees; when events arrive in bursts its p50 drops towards 0). "
        "TPOT per request: (last token time − first token time) ÷ (tokens after the first event), one value per request. "
        "Frontend CPU is the API-server process only (user+sys), engine processes excluded. "
        "Engine tok/s is vLLM's `vllm:generation_tokens_total` delta ÷ wall (in-process: tokens received). "
        "Foreign cores: CPU other processes on the machine used during the scenario.",
        "",
        *scenario_table(recs),
        "",
        "Plots: `tpot_vs_concurrency.png`, `tpot_p99_vs_concurrency.png`, `cpu_per_token_vs_concurrency.png`, `cpu_per_token_vs_length.png`, "
        "`throughput_vs_concurrency.png`.",
        "",
    ]
    (out / "results.md").write_text("\n".join(lines))
    (out / "targets.json").write_text(json.dumps(targets, indent=1))
    plot(out, recs)


def plot(out: Path, recs: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in recs if (r["system"], r["level"]) in SERIES]
    lengths = sorted({r["length"] for r in recs})
    # Only lengths measured at more than one concurrency make a line.
    lengths_c = [L for L in lengths if len({r["concurrency"] for r in recs if r["length"] == L}) > 1]

    def by_concurrency(metric, fname, ylabel, logy=False):
        if not lengths_c:
            return
        fig, axes = plt.subplots(1, len(lengths_c), figsize=(6 * len(lengths_c), 4.5), squeeze=False)
        for ax, L in zip(axes[0], lengths_c):
            for key, label in SERIES.items():
                pts = sorted((r["concurrency"], metric(r)) for r in recs if (r["system"], r["level"]) == key and r["length"] == L)
                pts = [(c, y) for c, y in pts if y is not None]
                if pts:
                    color, ls = STYLE[key]
                    ax.plot([c for c, _ in pts], [y for _, y in pts], marker="o", color=color, linestyle=ls, label=label)
            ax.set_xscale("log", base=2)
            if logy:
                ax.set_yscale("log")
            ax.set_title(f"{L} output tokens")
            ax.set_xlabel("concurrent streams")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=90)
        plt.close(fig)

    by_concurrency(lambda r: r["summary"]["tpot_req_ms"]["p50"], "tpot_vs_concurrency.png", "TPOT p50, per request (ms/token)")
    by_concurrency(lambda r: r["summary"]["tpot_ms"]["p99"], "tpot_p99_vs_concurrency.png", "TPOT p99, per token (ms)", logy=True)
    by_concurrency(lambda r: r.get("frontend_cpu_ms_per_token"), "cpu_per_token_vs_concurrency.png", "frontend CPU ms / output token", logy=True)
    by_concurrency(lambda r: r["summary"]["output_tok_s"], "throughput_vs_concurrency.png", "output tokens/s")

    concs = sorted({r["concurrency"] for r in recs})
    concs_l = [c for c in concs if len({r["length"] for r in recs if r["concurrency"] == c}) > 1]
    if concs_l:
        fig, axes = plt.subplots(1, len(concs_l), figsize=(6 * len(concs_l), 4.5), squeeze=False)
        for ax, c in zip(axes[0], concs_l):
            for key, label in SERIES.items():
                pts = sorted((r["length"], _cpu(r)) for r in recs if (r["system"], r["level"]) == key and r["concurrency"] == c)
                pts = [(x, y) for x, y in pts if y is not None]
                if pts:
                    color, ls = STYLE[key]
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=color, linestyle=ls, label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{c} concurrent stream{'s' if c > 1 else ''}")
            ax.set_xlabel("response length (output tokens)")
            ax.set_ylabel("frontend CPU ms / output token")
            ax.grid(True, alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "cpu_per_token_vs_length.png", dpi=90)
        plt.close(fig)


if __name__ == "__main__":
    write_report(Path(sys.argv[1]))
