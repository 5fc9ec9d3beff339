"""Unit checks of the benchmark harness that need no engine: `python -m pytest bench/test_bench.py`
(seconds; the app tier runs bench/'s checks beside tests/app). The report's: bench/test_report.py."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from bench import scenarios, stats, systems
from bench.loadgen import LoadResult, Stream, StreamResult, run_one
from bench.scenarios import Scenario, filtered, headline, schedule
from bench.systems import InprocWorker
from bench.workload import Workload

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


def _res(start: float, times: list[float], ntoks: list[int], end: float | None) -> StreamResult:
    return StreamResult(start=start, end=end, times=times, ntoks=ntoks)


def test_summarize_ttft_tpot_e2e() -> None:
    # Request 0: sent at 0, tokens at 0.1 (1), 0.3 (2: 0.1 s each), 0.4 (1); closed at 0.5.
    # Request 1: failed after its first token.
    a = _res(0.0, [0.1, 0.3, 0.4], [1, 2, 1], 0.5)
    b = _res(0.0, [0.2], [1], None)
    b.error = "boom"
    s = stats.summarize([a, b], wall_s=1.0)
    assert (s["requests"], s["completed"], s["errors"], s["first_error"]) == (2, 1, 1, "boom")
    assert s["output_tokens"] == 5 and s["token_events"] == 4 and s["output_tok_s"] == 5.0
    assert s["ttft_ms"]["n"] == 2 and s["ttft_ms"]["p50"] == pytest.approx(150.0)
    assert s["tpot_ms"]["n"] == 3 and s["tpot_ms"]["p50"] == pytest.approx(100.0)  # per token: 0.1, 0.1, 0.1
    assert s["tpot_req_ms"]["p50"] == pytest.approx(100.0)  # (0.4 - 0.1) / 3 tokens, completed only
    assert s["e2e_ms"] == {"p50": 500.0, "p90": 500.0, "p99": 500.0, "mean": 500.0, "n": 1}
    # Between events, whatever they carry: 0.2 and 0.1 s; four events for five tokens.
    assert s["event_gap_ms"]["n"] == 2 and s["event_gap_ms"]["p50"] == pytest.approx(150.0)
    assert s["event_gap_quantiles_ms"][0] == pytest.approx(100.0) and s["event_gap_quantiles_ms"][-1] == pytest.approx(200.0)
    assert s["events_per_token"] == 0.8
    load = LoadResult([a, b], started=0.0, finished=2.0, truncated=True, concurrency=2, requested=3)
    s = stats.summarize_load(load)
    assert (s["truncated"], s["concurrency"], s["output_tok_s"]) == (True, 2, 2.5)


def test_spread_and_paired() -> None:
    sp = stats.spread([5.0, 1.0, None, 3.0, 2.0, 4.0])
    assert sp == {"median": 3.0, "min": 1.0, "max": 5.0, "q1": 2.0, "q3": 4.0, "iqr": 2.0, "n": 5}
    assert stats.spread([])["median"] is None and stats.spread([None])["n"] == 0
    a, b = {0: 2.0, 1: 3.0, 2: None}, {0: 1.0, 1: 0.0, 2: 1.0, 3: 1.0}
    assert stats.paired(a, b, stats.ratio) == {0: 2.0, 1: None, 2: None}
    assert stats.paired(a, b, stats.difference) == {0: 1.0, 1: 3.0, 2: None}


# ------------------------------------------------------------------ scenarios and interleaving


def test_headline_interleaves() -> None:
    blocks = headline()
    all_scs = [sc for scs in blocks.values() for sc in scs]
    assert list(blocks) == ["ours", "vllm", "inproc"] and len({sc.id for sc in all_scs}) == len(all_scs) == 35
    runs = schedule(blocks, 5)
    assert len(runs) == 5 * 35 and len({sc.id for sc in runs}) == len(runs)
    cell = [sc for sc in runs if sc.cell == "stream-L512-c8"]
    rep0 = [sc.system + ":" + sc.level for sc in cell if sc.rep == 0]
    rep1 = [sc.system + ":" + sc.level for sc in cell if sc.rep == 1]
    http0 = ["ours:tokens", "vllm:tokens", "ours:text", "vllm:text", "ours:derender", "vllm:chat"]
    http1 = ["vllm:tokens", "ours:tokens", "vllm:text", "ours:text", "vllm:chat", "ours:derender"]
    assert rep0 == ["inproc:nodetok", "inproc:tokens", *http0]
    assert rep1 == [*http1, "inproc:nodetok", "inproc:tokens"]
    # A cell of one run per system rotates, so no system always runs between the other two.
    ttft = [[sc.system for sc in runs if sc.cell == "stream-L8-c32-p256" and sc.rep == r] for r in range(3)]
    assert ttft == [["inproc", "ours", "vllm"], ["ours", "vllm", "inproc"], ["vllm", "inproc", "ours"]]
    batch = {sc.system + ":" + sc.level for sc in runs if sc.batch}
    assert batch == {"inproc:tokens", "ours:tokens", "vllm:tokens", "ours:text", "vllm:text"}
    assert Scenario("ours", "tokens", 512, 32, 64, True, 3).id == "ours-tokens-L512-c32-batch-r3"
    assert Scenario("ours", "tokens", 8, 4, 8, rep=0, prompt_len=8000).id == "ours-tokens-L8-c4-p8000-r0"
    assert Scenario("vllm", "tokens", 8, 4, 8, prompt_len=8000).cell == "stream-L8-c4-p8000"
    assert filtered(blocks, "ours", "derender") == {"ours": [sc for sc in blocks["ours"] if sc.level == "derender"]}
    assert scenarios.lengths() == [8, 256, 512]


def test_headline_plan() -> None:
    """Issue #30's cells: 8, 32 and 64 streams at every level with both floors, 32 batch requests at
    two levels, then the TTFT cells at the tokens level; every request fits the engine."""
    blocks = headline()
    all_scs = [sc for scs in blocks.values() for sc in scs]
    levels = {"ours": {"tokens", "text", "derender"}, "vllm": {"tokens", "text", "chat"}, "inproc": {"nodetok", "tokens"}}
    for length, c in ((512, 8), (512, 32), (256, 64)):
        got = {(sc.system, sc.level) for sc in all_scs if (sc.length, sc.concurrency, sc.batch, sc.prompt_len) == (length, c, False, 0)}
        assert got == {(s, lv) for s, lvs in levels.items() for lv in lvs}, (length, c)
    assert {(sc.system, sc.level) for sc in all_scs if sc.prompt_len} == {(s, "tokens") for s in levels}
    cells = list(dict.fromkeys(sc.cell for sc in schedule(blocks, 5)))
    assert cells == ["stream-L512-c8", "stream-L512-c32", "stream-L256-c64", "batch-L512-c32", "stream-L8-c32-p256", "stream-L8-c4-p8000"]
    # The 8k prompts and their outputs fit the engine's max-model-len; four of them fit the KV cache (1 KiB/token in float32).
    flags = systems.engine_flags()
    max_len, kv = int(flags[flags.index("--max-model-len") + 1]), int(flags[flags.index("--kv-cache-memory-bytes") + 1])
    for sc in all_scs:
        assert max(sc.prompt_len, 262) + sc.length + 16 <= max_len
        assert sc.concurrency * (max(sc.prompt_len, 262) + sc.length + 16) * 1024 < kv / 10
    # --only picks cells alone; the whole plan at 5 repetitions is under an hour.
    only = filtered(blocks, None, r"L256-c64|-p[0-9]+")
    assert {sc.cell for scs in only.values() for sc in scs} == {cells[2], *cells[4:]}
    assert 40 * 60 < scenarios.estimate_s(schedule(blocks, 5), 3, 5.0, 300.0) < 60 * 60


# ------------------------------------------------------------------ unique prompts


def _wl() -> Workload:
    scripts = {8: {"content": [7] * 7, "tool": [7] * 7}}
    return Workload(prompt_ids=[1, 2, 3], scripts=scripts, filler_ids=[100, 101, 102], digit_ids=list(range(15, 25)), warm_length=8)


def test_unique_prompts_per_request() -> None:
    wl = _wl()
    assert wl.prompt(0, 3, 5) == [1, 2, 3]  # prompt_len 0: the chat prompt, as before
    p = wl.prompt(256, 0, 5)
    assert len(p) == 256 and p[:16] == [15 + int(ch) for ch in "0025600001000005"] and p[16:19] == [100, 101, 102]
    prompts = {tuple(wl.prompt(n, rep, seq)[:16]) for n in (256, 8000) for rep in (None, 0, 1, 2) for seq in range(300)}
    assert len(prompts) == 2 * 4 * 300  # the first 16-token block differs: no shared prefix-cache block
    assert len(wl.prompt(8000, 4, 7)) == 8000
    # The same ids for every system: the servers' bodies, and the floor's (from the JSON the worker reads).
    body = wl.stream("tokens", 8, 7, prompt_len=8000, rep=4).body
    assert body["token_ids"] == wl.prompt(8000, 4, 7) and body["sampling_params"]["extra_args"]["replay_token_ids"] == [7] * 7
    assert wl.stream("tokens", 8, 7).body["token_ids"] == [1, 2, 3]
    assert Workload.from_json(wl.to_json()).prompt(8000, 4, 7) == wl.prompt(8000, 4, 7)
    with pytest.raises(ValueError):
        wl.stream("chat", 8, 0, prompt_len=256)


def test_runner_and_floor_send_the_same_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workload.requests_of (HTTP systems) and bench.inproc.run_scenario (the floor, fed the scenario as
    the --bench-serve protocol sends it) use the same prompt for each (rep, seq)."""
    import types
    from dataclasses import asdict

    from bench import inproc

    wl = _wl()
    sc = Scenario("inproc", "tokens", 8, 4, 8, rep=2, prompt_len=300)
    http = wl.requests_of(replace(sc, system="ours"))
    sent = {}

    class FakeLLM:
        async def generate(self, prompt, sp, req_id):
            sent[int(req_id.rsplit("-", 1)[1])] = prompt["prompt_token_ids"]
            out = types.SimpleNamespace(token_ids=sp["extra_args"]["replay_token_ids"] + [0], finish_reason="stop")
            yield types.SimpleNamespace(outputs=[out])

    fake_vllm = {
        "vllm.inputs": types.SimpleNamespace(TokensPrompt=dict),
        "vllm.sampling_params": types.SimpleNamespace(SamplingParams=dict, RequestOutputKind=types.SimpleNamespace(FINAL_ONLY=1, DELTA=0)),
    }
    for name, mod in fake_vllm.items():
        monkeypatch.setitem(sys.modules, name, mod)
    line = json.loads(json.dumps({**asdict(sc), "name": sc.id, "time_limit_s": 30}))  # what InprocWorker.run writes
    load = asyncio.run(inproc.run_scenario(FakeLLM(), Workload.from_json(wl.to_json()), line, "s0"))
    assert len(load.results) == 8 and all(r.tokens == 8 for r in load.results)
    assert sent == {i: http(i).body["token_ids"] for i in range(8)}
    assert len({tuple(p) for p in sent.values()}) == 8


# ------------------------------------------------------------------ load generator: batch requests


def test_batch_request_is_one_event() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["stream"] is False
        return httpx.Response(200, json={"choices": [{"index": 0, "token_ids": [1, 2, 3], "finish_reason": "stop"}]})

    async def go() -> StreamResult:
        async with httpx.AsyncClient(base_url="http://127.0.0.1", transport=httpx.MockTransport(handler)) as client:
            return await run_one(client, Stream("/inference/v1/generate", {"stream": False}, kind="batch"))

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


# ------------------------------------------------------------------ what the subprocesses import by name


def test_the_modules_the_systems_run_exist() -> None:
    """The servers, the engine core and the floor import these by name in other processes: a moved
    module fails here rather than minutes into a run."""
    import importlib.util

    replay_module, _, replay_class = systems.REPLAY.partition(":")
    names = (systems.SERVE_MODULE, replay_module, "bench.inproc")
    assert [n for n in names if importlib.util.find_spec(n) is None] == []
    assert f"class {replay_class}(" in Path(importlib.util.find_spec(replay_module).origin).read_text()
    assert systems.ours(Path("m"), Path("logs"), "auto", []).argv[1:3] == ["-m", systems.SERVE_MODULE]
