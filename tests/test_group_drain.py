"""A signal to the server's whole process group (Ctrl+C, `kill -TERM -- -PGID`, init wrappers),
on a real engine: the engine core lives in a session of its own (decode_server/process/engine_session.py),
so the group's SIGTERM reaches only the server, which drains as for a SIGTERM to its pid; and a
SIGKILL of the server still leaves no engine process behind (the engine gets SIGTERM when its
parent dies). Without an engine: tests/test_engine_session.py."""

from __future__ import annotations

import os
import signal
import time

import httpx
import psutil
import pytest

from tests import servers
from tests.inprocess import body_for
from tests.observability_queries import Query, dashboard_queries, load_dashboard, selectors
from tests.processes import engine_cores
from tests.prometheus_server import Prometheus, prometheus
from tests.stream_reader import StreamReader
from tests.support import GENERATE, choice_chunks, finish_reason, joined_text, joined_tokens

pytestmark = pytest.mark.real_engine

IM_END = 151645
MODES = ("tokens", "text", "derender")
STREAMS = 16
# Each stream's tokens: long enough that all 16 are still open when the signal comes (eager engines
# on a quiet machine ran 64 tokens before the last stream's first event), short enough to end well
# inside the window on 2 shared cores.
SCRIPT = [9707] * 1024
WINDOW_S = 120
ENDLESS = {"max_tokens": 4000, "ignore_eos": True}


def _detached(server: servers.Server) -> list[psutil.Process]:
    cores = engine_cores(server)
    for core in cores:
        assert os.getsid(core.pid) == os.getpgid(core.pid) == core.pid != os.getpgid(server.proc.pid), core
    return cores


def _output(reader: StreamReader) -> list[int] | str:
    events = reader.payloads()
    mode = reader.body["output_mode"]
    if mode == "tokens":
        return joined_tokens(events)
    if mode == "text":
        return joined_text(events)
    return "".join(c["delta"].get("content") or "" for c in choice_chunks(events))


def _engine_panels() -> list[Query]:
    """The dashboard's queries on vLLM's own series that any engine has (not the KV connector's)."""
    return [
        q for q in dashboard_queries(load_dashboard())
        if all(s.name.startswith("vllm:") and "nixl" not in s.name and "kv_fetch" not in s.name for s in selectors(q.promql))
    ]


def test_sigterm_to_the_process_group_drains_every_stream_then_exits_zero(demo_model, log_dir, tokenizer, tmp_path):
    """And a real Prometheus scrapes it: the dashboard's engine panels have data, and the drain is
    seen (decode_server_draining 1: the server still answers scrapes while it drains)."""
    prometheus()  # missing: a failure that says how to install it, before the engine starts
    server = servers.ours(
        "group-drain", demo_model, log_dir, *servers.PARSER_FLAGS, "--shutdown-timeout", str(WINDOW_S),
        "--max-num-seqs", str(STREAMS + 1),
    ).start()
    prom = None
    try:
        prom = Prometheus(tmp_path, server.url.removeprefix("http://"))
        cores = _detached(server)
        everyone = [*psutil.Process(server.proc.pid).children(recursive=True)]
        warm = httpx.post(server.url + GENERATE, json=body_for("tokens", SCRIPT[:8], request_id="warm"), timeout=120)
        assert warm.status_code == 200, warm.text
        panels = _engine_panels()
        prom.until(lambda: all(prom.query(q.promql) for q in panels), f"data for {[q.where for q in panels]}")
        # One more, endless (first, so it has a slot): it keeps the drain open until the test has
        # seen the drain scraped, then it is aborted.
        held = StreamReader(server.url, body_for("tokens", [], request_id="group-held", sampling_params=ENDLESS))
        held.wait_events(1)
        readers = [
            StreamReader(server.url, body_for(MODES[i % len(MODES)], SCRIPT, request_id=f"group-{i}"))
            for i in range(STREAMS)
        ]
        for reader in readers:
            reader.wait_events(1)
        assert not any(r.done() for r in readers), "every stream is open when the signal comes"
        started = time.monotonic()
        os.killpg(server.proc.pid, signal.SIGTERM)
        prom.until(lambda: prom.query('decode_server_draining{job="decode-server"} == 1'), "scraping the drain")
        for reader in readers:
            reader.join(WINDOW_S + 30)
        assert server.proc.poll() is None and not held.done(), "the drain lasts while a request is in flight"
        aborted = httpx.post(server.url + "/abort_requests", json={"request_ids": ["group-held"]}, timeout=10)
        assert aborted.status_code == 200, aborted.text
        held.join(30)
        code = server.proc.wait(60)
        elapsed = time.monotonic() - started
        _, alive = psutil.wait_procs([*everyone, *cores], timeout=30)
    finally:
        server.stop()
        if prom is not None:
            prom.close()
    ends = [(r.body["output_mode"], finish_reason(r.payloads()), r.payloads()[-1:]) for r in readers]
    assert ends == [(MODES[i % len(MODES)], "stop", ["[DONE]"]) for i in range(STREAMS)], server.log_tail()
    text = tokenizer.decode(SCRIPT)
    assert [_output(r) for r in readers] == [
        {"tokens": SCRIPT + [IM_END], "text": text, "derender": text}[MODES[i % len(MODES)]] for i in range(STREAMS)
    ]
    assert (finish_reason(held.payloads()), held.payloads()[-1]) == ("abort", "[DONE]")
    assert code == 0, server.log_tail()
    assert elapsed < WINDOW_S, f"{elapsed:.1f} s: the drain ended when the streams did, not at the deadline"
    assert not alive, f"outlived the server: {alive}"
    print(f"16 streams drained; exit 0 after {elapsed:.1f} s")


def test_a_sigkill_of_the_server_leaves_no_engine_process(demo_model, log_dir):
    server = servers.ours("group-sigkill", demo_model, log_dir).start()
    try:
        cores = _detached(server)
        server.proc.kill()  # the server's pid only: its group is not signalled
        server.proc.wait(10)
        started = time.monotonic()
        _, alive = psutil.wait_procs(cores, timeout=30)
    finally:
        for core in cores:
            if core.is_running():
                core.kill()
        server.stop()
    assert not alive, f"the engine outlived the server by 30 s: {alive}"
    print(f"engine core ended {time.monotonic() - started:.1f} s after the server's SIGKILL")
