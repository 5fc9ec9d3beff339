"""results.json -> figure.svg: one picture per benchmark run (`python -m bench.report RUN` draws it).

Left: frontend CPU per token, ours ÷ vLLM's own server, per scenario: the median over the
repetitions, a bar from min to max, and the target line (streams ≤ 0.75×, batch ≤ 0.7×).
Right: what a client waits between two events that carry tokens, ours against vLLM's, at each level
of the run's busiest stream scenario that has them all: the distribution as quantile curves (the median of each
quantile over the repetitions). A run recorded before results.json kept that distribution shows the
per-token gap's p50/p90/p99 instead, and says so.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display here or in CI
matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, and searchable
import matplotlib.pyplot as plt  # noqa: E402

from bench.report import aggregate, cell_of, valid  # noqa: E402
from bench.report_targets import TARGETS  # noqa: E402
from bench.stats import GAP_QUANTILES  # noqa: E402

LEVEL_COLOURS = {"tokens": "tab:blue", "text": "tab:green", "derender": "tab:red"}


def _ratio_panel(ax: Any, rows: list[dict[str, Any]]) -> None:
    rows = [r for r in rows if r["cpu_ratio"].get("median") is not None]
    ys = range(len(rows))
    for y, r in zip(ys, rows):
        spread = r["cpu_ratio"]
        colour = LEVEL_COLOURS.get(r["ours_level"], "black")
        ax.plot([spread["min"], spread["max"]], [y, y], color=colour, linewidth=2, alpha=0.5)
        ax.plot(spread["median"], y, "o", color=colour)
        target = TARGETS["batch" if r["batch"] else "stream"]
        ax.plot([target, target], [y - 0.4, y + 0.4], color="black", linestyle=":", linewidth=1)
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_yticks(list(ys), [r["label"] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("frontend CPU per token, ours ÷ vLLM (dotted: target)")
    ax.set_title("CPU per token (median, min–max)", fontsize=9)


def _busiest_stream_cell(recs: list[dict[str, Any]]) -> str | None:
    """The stream scenario with the most levels run, the most concurrent of those."""
    levels: dict[str, set[str]] = {}
    concurrency: dict[str, int] = {}
    for r in recs:
        if not r.get("batch") and not r.get("prompt_len"):
            levels.setdefault(cell_of(r), set()).add(r["level"])
            concurrency[cell_of(r)] = r["concurrency"]
    return max(levels, key=lambda c: (len(levels[c]), concurrency[c])) if levels else None


def _median_curve(recs: list[dict[str, Any]]) -> tuple[list[float], list[float], str] | None:
    """(x, y in ms, what y is) over the repetitions of one system and level."""
    with_quantiles = [r["summary"]["event_gap_quantiles_ms"] for r in recs if r["summary"].get("event_gap_quantiles_ms")]
    if with_quantiles:
        ys = [statistics.median(q[i] for q in with_quantiles if q[i] is not None) for i in range(len(GAP_QUANTILES))]
        return list(GAP_QUANTILES), ys, "gap between token-carrying events"
    per_token = [r["summary"]["tpot_ms"] for r in recs if r["summary"].get("tpot_ms", {}).get("p50") is not None]
    if per_token:
        xs = [50, 90, 99]
        return xs, [statistics.median(t[f"p{x}"] for t in per_token) for x in xs], "per-token gap (p50/p90/p99 only)"
    return None


def _gap_panel(ax: Any, recs: list[dict[str, Any]]) -> None:
    cell = _busiest_stream_cell(recs)
    what = set()
    for ours_level, vllm_level in (("tokens", "tokens"), ("text", "text"), ("derender", "chat")):
        for system, level, style in (("ours", ours_level, "-"), ("vllm", vllm_level, "--")):
            runs = [r for r in recs if cell_of(r) == cell and (r["system"], r["level"]) == (system, level) and valid(r)]
            curve = _median_curve(runs)
            if curve is None:
                continue
            xs, ys, kind = curve
            what.add(kind)
            per_token = statistics.median(r["summary"].get("events_per_token") or _events_per_token(r) for r in runs)
            label = f"{system} {level} ({per_token:.3f} events/token)"
            ax.plot(xs, ys, style, color=LEVEL_COLOURS[ours_level], label=label, marker="." if len(xs) < 5 else None)
    ax.set_yscale("log")
    ax.set_xlabel("quantile (%)")
    ax.set_ylabel("ms")
    ax.set_title(f"{' / '.join(sorted(what)) or 'no stream runs'}, {cell}", fontsize=9)
    ax.legend(fontsize=7)


def _events_per_token(r: dict[str, Any]) -> float:
    s = r["summary"]
    return s["token_events"] / s["output_tokens"] if s.get("output_tokens") else float("nan")


def write_figure(out: Path) -> Path:
    data = json.loads((out / "results.json").read_text())
    recs = data["scenarios"]
    rows = [r for r in aggregate(recs) if not r["prompt_len"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, max(4.0, 0.28 * len(rows) + 1.5)), width_ratios=(1.1, 1))
    _ratio_panel(left, rows)
    _gap_panel(right, recs)
    fig.suptitle(f"decode-server vs vLLM's own server: {data['meta'].get('mode')} run, {data['meta'].get('started')}", fontsize=10)
    fig.tight_layout()
    path = out / "figure.svg"
    fig.savefig(path)
    plt.close(fig)
    return path
