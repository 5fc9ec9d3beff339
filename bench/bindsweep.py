"""`python -m bench.run --bind-sweep`: which engine thread setting is fastest for one instance here.

For each VLLM_CPU_OMP_THREADS_BIND value (plus `nobind` with --enforce-eager, to
see what torch.compile buys) it starts our server alone on the standard engine
configuration and measures: start-up time, one 2048-token tokens-level stream
(c=1: the engine's step latency) and 32 concurrent 256-token streams (c=32:
throughput, where engine and frontend compete for the 2 cores).
Writes OUT/bind-sweep.json and OUT/bind-sweep.md.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from bench import systems
from bench.common import arun, ensure_model
from bench.loadgen import run_load
from bench.measure import CpuMeter, wait_quiet
from bench.stats import summarize_load
from bench.workload import Workload

VARIANTS = [
    ("nobind", []),
    ("0-1", []),
    ("1", []),
    ("auto", []),
    ("nobind", ["--enforce-eager"]),
]
CASES = [("tokens", 2048, 1, 1), ("tokens", 256, 32, 32)]


def sweep(out: Path | None) -> int:
    from transformers import AutoTokenizer

    out = out or systems.repo_root() / "bench" / "results" / f"{dt.date.today().isoformat()}-bind-sweep"
    out.mkdir(parents=True, exist_ok=True)
    model_dir = ensure_model()
    wl = Workload.build(AutoTokenizer.from_pretrained(model_dir), [256, 2048])
    rows = []
    for bind, extra in VARIANTS:
        name = bind + (" " + " ".join(extra) if extra else "")
        server = systems.ours(model_dir, out / "raw-tmp" / "logs", bind, systems.engine_flags() + extra)
        server.log_path = out / "raw-tmp" / "logs" / f"ours-{bind}{'-eager' if extra else ''}.log"
        try:
            server.start()
            arun(run_load(server.url, lambda w, i: wl.stream("tokens", 256, i), concurrency=4, requests=4, time_limit_s=120))
            row = {"variant": name, "startup_s": server.startup_s, "cases": {}}
            for level, L, c, n in CASES:
                meter = CpuMeter(server.pid)
                quiet = wait_quiet(meter, 30)
                a = meter.snapshot()
                load = arun(run_load(server.url, lambda w, i: wl.stream(level, L, i), concurrency=c, requests=n, time_limit_s=300))
                cpu = CpuMeter.delta(a, meter.snapshot())
                s = summarize_load(load)
                row["cases"][f"L{L}-c{c}"] = {
                    "output_tok_s": s["output_tok_s"],
                    "tpot_p50_ms": s["tpot_ms"]["p50"],
                    "tpot_p99_ms": s["tpot_ms"]["p99"],
                    "frontend_cpu_ms_per_token": round(cpu["frontend_cpu_s"] * 1000 / max(1, s["output_tokens"]), 4),
                    "engine_cpu_s": cpu["engine_cpu_s"],
                    "foreign_cores": cpu["foreign_cores"],
                    "quiet": quiet,
                }
            rows.append(row)
            print(json.dumps(row), flush=True)
        except Exception as e:
            rows.append({"variant": name, "error": str(e)[:1000]})
        finally:
            server.stop()
    (out / "bind-sweep.json").write_text(json.dumps({"at": dt.datetime.now().isoformat(timespec="seconds"), "loadavg": os.getloadavg(), "rows": rows}, indent=1))
    lines = [
        "| VLLM_CPU_OMP_THREADS_BIND | start-up s | L2048 c1 tok/s | TPOT p50 ms | L256 c32 tok/s | TPOT p50 ms | foreign cores (c1, c32) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | error: {r['error'][:80]} | | | | | |")
            continue
        a, b = r["cases"]["L2048-c1"], r["cases"]["L256-c32"]
        lines.append(
            f"| {r['variant']} | {r['startup_s']} | {a['output_tok_s']} | {a['tpot_p50_ms']} | {b['output_tok_s']} | "
            f"{b['tpot_p50_ms']} | {a['foreign_cores']}, {b['foreign_cores']} |"
        )
    (out / "bind-sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0
