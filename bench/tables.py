"""Markdown pieces both reports use (bench.report for the matrix modes, bench.headline for --headline)."""

from __future__ import annotations

import statistics
from typing import Any

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


_f = fmt


def header_lines(meta: dict, recs: list[dict], title: str | None = None) -> list[str]:
    """Title, machine, engine, wall time, contention and errors of a run."""
    foreign = [r["cpu"].get("foreign_cores") or 0 for r in recs]
    busy = [r["id"] for r in recs if (r["cpu"].get("foreign_cores") or 0) > 0.3]
    m = meta["machine"]
    title = title or f"# decode-server benchmarks: {meta['mode']} run, {meta['started']}"
    lines = [
        title,
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
    return lines


def scenario_table(recs: list[dict]) -> list[str]:
    lines = [
        "| system | scenario | L | c | ok/n | TTFT p50 / p99 ms | TPOT per token p50 / p90 / p99 ms | TPOT per request p50 / p99 ms | E2E p50 / p90 / p99 ms | tokens/event | out tok/s | engine tok/s | frontend CPU ms/token | frontend cores | foreign cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        s = r["summary"]
        name = r["level"] + (" (batch)" if r.get("batch") else "") + ("" if r.get("rep") is None else f", rep {r['rep']}")
        blocks = [(name, s)]
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


