"""PNG plots: the matrix modes' lines over concurrency and length (`plot`), and the headline
mode's bars with spread error bars (`plot_headline`), one colour per system.

Called by bench.report; matplotlib is imported only here.
"""

from __future__ import annotations

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


def _cpu(r: dict | None) -> float | None:
    return None if r is None else r.get("frontend_cpu_ms_per_token")


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


# ------------------------------------------------------------------ headline (interleaved repetitions)

COLORS = {"ours": "tab:blue", "vllm": "tab:orange", "floor": "tab:green"}
NAMES = {"ours": "ours (decode-server)", "vllm": "vLLM's own server", "floor": "in-process AsyncLLM (the floor)"}


def _median_err(spreads: list[dict[str, Any]]) -> tuple[list[float], list[list[float]]]:
    """Bar heights (medians) and asymmetric error bars (down to min, up to max); NaN where missing."""
    nan = float("nan")
    med = [nan if s.get("median") is None else s["median"] for s in spreads]
    lo = [0.0 if s.get("median") is None else s["median"] - s["min"] for s in spreads]
    hi = [0.0 if s.get("median") is None else s["max"] - s["median"] for s in spreads]
    return med, [lo, hi]


def _bars(ax, labels: list[str], groups: dict[str, list[dict[str, Any]]], ylabel: str, title: str) -> None:
    width = 0.8 / max(1, len(groups))
    for k, (name, spreads) in enumerate(groups.items()):
        med, err = _median_err(spreads)
        xs = [i + (k - (len(groups) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, med, width, yerr=err, capsize=3, color=COLORS[name], label=NAMES[name])
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)


def _ratio_points(ax, labels: list[str], spreads: list[dict[str, Any]], ylabel: str, title: str) -> None:
    med, err = _median_err(spreads)
    ax.errorbar(range(len(labels)), med, yerr=err, fmt="o", color="black", capsize=4)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="parity")
    ax.axhline(0.5, color="tab:red", linestyle=":", linewidth=1, label="issue #5 target (≤ 0.5×)")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)


def plot_headline(out: Path, rows: list[dict[str, Any]]) -> None:
    """Bars per headline scenario, one colour per system, error bars = min–max over the repetitions."""
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["label"].replace(": ", "\n") for r in rows]
    w = max(8.0, 1.3 * len(rows))

    def per_system(metric: str, fname: str, ylabel: str, title: str) -> None:
        fig, ax = plt.subplots(figsize=(w, 4.8))
        _bars(ax, labels, {n: [r["systems"][n][metric] for r in rows] for n in COLORS}, ylabel, title)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=90)
        plt.close(fig)

    per_system("cpu_ms_per_token", "headline_cpu_per_token.png", "frontend CPU ms / output token", "Frontend CPU per token")
    per_system("output_tok_s", "headline_throughput.png", "output tokens/s", "Throughput")
    # TTFT: streams and batch requests on their own axes (a batch response's "first token" is all of it).
    parts = [(False, "TTFT p50 (ms)", "Time to first token, streams"), (True, "response time p50 (ms)", "Batch: TTFT = whole response")]
    parts = [(b, y, t) for b, y, t in parts if any(r["batch"] == b for r in rows)]
    fig, axes = plt.subplots(1, len(parts), figsize=(w, 4.8), squeeze=False, gridspec_kw={"width_ratios": [sum(r["batch"] == b for r in rows) for b, _, _ in parts]})
    for ax, (batch, ylabel, title) in zip(axes[0], parts):
        sub = [(lb, r) for lb, r in zip(labels, rows) if r["batch"] == batch]
        _bars(ax, [lb for lb, _ in sub], {n: [r["systems"][n]["ttft_p50_ms"] for _, r in sub] for n in COLORS}, ylabel, title)
    fig.tight_layout()
    fig.savefig(out / "headline_ttft.png", dpi=90)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(2 * w, 4.8))
    ov = {n: [r["overhead_ms_per_token"][n] for r in rows] for n in ("ours", "vllm")}
    _bars(a1, labels, ov, "CPU ms / token above the floor", "Overhead above the in-process floor")
    _ratio_points(a2, labels, [r["overhead_ratio"] for r in rows], "ours overhead ÷ vLLM overhead", "Overhead ratio (per repetition)")
    fig.tight_layout()
    fig.savefig(out / "headline_overhead.png", dpi=90)
    plt.close(fig)


def plot_headline_ttft(out: Path, rows: list[dict[str, Any]]) -> None:
    """The TTFT cells (unique prompts): TTFT p50 and p90 per system, one panel per cell (own scale)."""
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 4.5), squeeze=False)
    for ax, r in zip(axes[0], rows):
        groups = {n: [r["systems"][n]["ttft_p50_ms"], r["systems"][n]["ttft_p90_ms"]] for n in COLORS}
        _bars(ax, ["TTFT p50", "TTFT p90"], groups, "ms", r["label"].split(":")[0])
    fig.tight_layout()
    fig.savefig(out / "headline_ttft_prompts.png", dpi=90)
    plt.close(fig)
