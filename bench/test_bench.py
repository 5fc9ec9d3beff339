"""Unit checks of the benchmark harness that need no engine: `python -m pytest bench/test_bench.py`.

(Not under tests/, so the project's suite does not collect them; they take about a second.)
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from bench import stats
from bench.headline import aggregate, write_headline_report
from bench.interleave import schedule
from bench.loadgen import LoadResult, Stream, StreamResult, run_one
from bench.plans import MODES, Scenario, plan
from bench.systems import InprocWorker

# ------------------------------------------------------------------ stats


def test_percentile_interpolates() -> None:
    assert stats.percentile([], 50) is None
    assert stats.percentile([3.0], 99) == 3.0
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert stats.percentile([0.0, 10.0], 90) == pytest.approx(9.0)
    assert stats.percentile([1.0, 2.0, 3.0], 100) == 3.0


def test_dist_ms() -> None:
    d = stats.dist_ms([0.001, 0.002, 0.003])
    assert d == {"p50": 2.0, "p90": 2.8, "p99": 2.98, "mean": 2.0, "n": 3}
    assert stats.dist_ms([])["p50"] is None


def _res(start: float, times: list[float], ntoks: list[int], end: float | None, label: str = "x") -> StreamResult:
    return StreamResult(label=label, start=start, end=end, times=times, ntoks=ntoks)


def test_summarize_ttft_tpot_e2e() -> None:
    # Request 0: sent at 0, tokens at 0.1 (1), 0.3 (2: 0.1 s each), 0.4 (1); closed at 0.5.
    # Request 1: failed after its first token.
    a = _res(0.0, [0.1, 0.3, 0.4], [1, 2, 1], 0.5, "tokens")
    b = _res(0.0, [0.2], [1], None, "derender")
    b.error = "boom"
    s = stats.summarize([a, b], wall_s=1.0)
    assert (s["requests"], s["completed"], s["errors"], s["first_error"]) == (2, 1, 1, "boom")
    assert s["output_tokens"] == 5 and s["token_events"] == 4 and s["output_tok_s"] == 5.0
    assert s["ttft_ms"]["n"] == 2 and s["ttft_ms"]["p50"] == pytest.approx(150.0)
    assert s["tpot_ms"]["n"] == 3 and s["tpot_ms"]["p50"] == pytest.approx(100.0)  # per token: 0.1, 0.1, 0.1
    assert s["tpot_req_ms"]["p50"] == pytest.approx(100.0)  # (0.4 - 0.1) / 3 tokens, completed only
    assert s["e2e_ms"] == {"p50": 500.0, "p90": 500.0, "p99": 500.0, "mean": 500.0, "n": 1}
    load = LoadResult([a, b], started=0.0, finished=1.0, truncated=False, concurrency=2, requested=2)
    by = stats.summarize_load(load)["by_label"]
    assert set(by) == {"tokens", "derender"} and by["tokens"]["output_tokens"] == 4
    assert stats.raw_trace(load)[0]["times"] == [0.1, 0.3, 0.4]


def test_spread_and_paired() -> None:
    sp = stats.spread([5.0, 1.0, None, 3.0, 2.0, 4.0])
    assert sp == {"median": 3.0, "min": 1.0, "max": 5.0, "q1": 2.0, "q3": 4.0, "iqr": 2.0, "n": 5}
    assert stats.spread([])["median"] is None and stats.spread([None])["n"] == 0
    a, b = {0: 2.0, 1: 3.0, 2: None}, {0: 1.0, 1: 0.0, 2: 1.0, 3: 1.0}
    assert stats.paired(a, b, stats.ratio) == {0: 2.0, 1: None, 2: None}
    assert stats.paired(a, b, stats.difference) == {0: 1.0, 1: 3.0, 2: None}


# ------------------------------------------------------------------ plans and interleaving


def test_plans_are_typed_and_headline_interleaves() -> None:
    for mode in MODES:
        pl = plan(mode)
        assert pl.mode == mode and pl.scenarios() and pl.flags
        assert len({sc.id for sc in pl.scenarios()}) == len(pl.scenarios())
    pl = plan("headline")
    assert pl.interleaved and pl.repeat == 5 and plan("headline", 7).repeat == 7
    runs = schedule(pl.blocks, pl.repeat)
    assert len(runs) == 5 * len(pl.scenarios()) and len({sc.id for sc in runs}) == len(runs)
    cell = [sc for sc in runs if sc.cell == "stream-L512-c8"]
    rep0 = [sc.system + ":" + sc.level for sc in cell if sc.rep == 0]
    rep1 = [sc.system + ":" + sc.level for sc in cell if sc.rep == 1]
    assert rep0 == ["inproc:tokens", "ours:tokens", "vllm:tokens", "ours:text", "vllm:text", "ours:derender", "vllm:chat"]
    assert rep1 == ["vllm:tokens", "ours:tokens", "vllm:text", "ours:text", "vllm:chat", "ours:derender", "inproc:tokens"]
    batch = {sc.system + ":" + sc.level for sc in runs if sc.batch}
    assert batch == {"inproc:tokens", "ours:tokens", "vllm:tokens", "ours:text", "vllm:text"}
    assert {sc.concurrency for sc in runs if not sc.batch} == {8, 32}
    assert Scenario("ours", "tokens", 512, 32, 64, True, 3).id == "ours-tokens-L512-c32-batch-r3"
    assert plan("quick").filtered("ours", "derender").keys() == {"ours"}


# ------------------------------------------------------------------ headline aggregation and report


def _record(system: str, level: str, rep: int, cpu: float, ttft: float = 10.0, batch: bool = False) -> dict:
    sc = Scenario(system, level, 512, 8, 16, batch, rep)
    d = {"p50": ttft, "p90": ttft, "p99": ttft, "mean": ttft, "n": 16}
    summary = {"requests": 16, "completed": 16, "errors": 0, "truncated": False, "output_tok_s": 1000.0 + rep, "output_tokens": 8192,
               "ttft_ms": d, "tpot_ms": d, "tpot_req_ms": d, "e2e_ms": d, "tokens_per_event": 1.0}  # fmt: skip
    return {"id": sc.id, "system": system, "level": level, "length": 512, "concurrency": 8, "requests": 16, "batch": batch,
            "rep": rep, "cell": sc.cell, "summary": summary, "cpu": {"foreign_cores": 0.1}, "frontend_cpu_ms_per_token": cpu,
            "exact_length": True}  # fmt: skip


def test_headline_aggregate_and_report(tmp_path: Path) -> None:
    recs = []
    for rep in range(5):
        recs += [_record("inproc", "tokens", rep, 0.05), _record("ours", "tokens", rep, 0.15 + 0.01 * rep), _record("vllm", "tokens", rep, 0.25)]
    recs.append({**_record("ours", "text", 0, 0.2), "exact_length": False})  # an invalid run is left out
    rows = aggregate(recs)
    assert [r["label"] for r in rows] == ["stream c8: tokens vs tokens", "stream c8: text vs text"]
    row = rows[0]
    assert row["systems"]["ours"]["cpu_ms_per_token"]["median"] == pytest.approx(0.17)
    assert row["cpu_ratio"]["n"] == 5 and row["cpu_ratio"]["median"] == pytest.approx(0.68)
    assert row["overhead_ms_per_token"]["ours"]["median"] == pytest.approx(0.12)
    assert row["overhead_ms_per_token"]["vllm"]["median"] == pytest.approx(0.20)
    assert row["overhead_ratio"]["min"] == pytest.approx(0.5) and row["overhead_ratio"]["max"] == pytest.approx(0.7)
    assert rows[1]["systems"]["ours"]["cpu_ms_per_token"]["n"] == 0
    meta = {"mode": "headline", "started": "now", "repeat": 5, "machine": {"cpus": 2, "cpu_model": "x", "mem_gib": 23.5, "python": "3",
            "vllm": "0.32"}, "engine_flags": [], "tool_flags": [], "bind": "auto", "prompt_tokens": 262, "loadavg_start": [0, 0, 0]}  # fmt: skip
    pytest.importorskip("matplotlib")
    write_headline_report(tmp_path, {"meta": meta, "scenarios": recs})
    md = (tmp_path / "results.md").read_text()
    assert "0.680 [" in md and "headline run (5 interleaved repetitions)" in md
    for png in ("headline_cpu_per_token", "headline_overhead", "headline_ttft", "headline_throughput"):
        assert (tmp_path / f"{png}.png").stat().st_size > 1000
    assert json.loads((tmp_path / "headline.json").read_text())[0]["cell"] == "stream-L512-c8"


# ------------------------------------------------------------------ load generator: batch requests


def test_batch_request_is_one_event() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["stream"] is False
        return httpx.Response(200, json={"choices": [{"index": 0, "token_ids": [1, 2, 3], "finish_reason": "stop"}]})

    async def go() -> StreamResult:
        async with httpx.AsyncClient(base_url="http://127.0.0.1", transport=httpx.MockTransport(handler)) as client:
            return await run_one(client, Stream("tokens", "/inference/v1/generate", {"stream": False}, kind="batch"))

    r = asyncio.run(go())
    assert r.completed and r.tokens == 3 and r.ntoks == [3] and r.finish_reason == "stop" and r.events == 1
    s = stats.summarize([r], 1.0)
    assert s["ttft_ms"]["p50"] == s["e2e_ms"]["p50"] and s["tpot_req_ms"]["n"] == 0


# ------------------------------------------------------------------ the floor's worker protocol


def test_inproc_worker_protocol(tmp_path: Path) -> None:
    """The parent side of `bench.inproc --bench-serve`, against a stand-in that speaks the same protocol."""
    fake = tmp_path / "fake_worker.py"
    fake.write_text(textwrap.dedent("""
        import json, os, sys
        from pathlib import Path
        work = Path(sys.argv[sys.argv.index("--bench-serve") + 1])
        (work / "ready").write_text(str(os.getpid()))
        for line in sys.stdin:
            sc = json.loads(line)
            tmp = work / (".%s.tmp" % sc["name"])
            tmp.write_text(json.dumps({"scenario": sc, "echo": sc["length"] * 2}))
            tmp.rename(work / (sc["name"] + ".json"))
    """))
    w = InprocWorker(Path("model"), tmp_path / "logs", "nobind", [], tmp_path / "wl.json", tmp_path / "work")
    w.argv = [sys.executable, str(fake), *w.argv[3:]]
    w.start(timeout_s=30)
    try:
        assert w.run({"name": "a", "length": 4}, 30)["echo"] == 8
        assert w.run({"name": "b", "length": 5}, 30)["echo"] == 10
    finally:
        w.stop(timeout_s=10)
    assert w.proc.returncode == 0
