"""`--api-server-count 2` on a real engine: two API processes on one socket, one shared engine core.

Which process accepts a connection is not ours to pick (vLLM's least-loaded accept), but every
response names its process (`X-Api-Server-Index`), and a process with an open connection is not
the least loaded, so `connection_to(i)` opens connections (keeping the others open) until one
lands on process i.

The server is the `hf` parser class's (tests/support/parser_class_servers.py: the demo model with a
response template, vLLM's `hf` parsers, which requests in token mode never reach), shared with
tests/engine/test_parser_matrix_real.py, which runs before this module by name: one engine start
for both. The drain test ends it, so it runs last.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from typing import Any

import httpx
import psutil
import pytest

from decode_server.config import DRAIN_FLUSH_S
from tests.support.parser_class_servers import DRAIN_S, SCALE_OUT
from tests.support.processes import sigterm_and_wait
from tests.support.stream_reader import INDEX, StreamReader, connection_to
from tests.support import GENERATE, finish_reason, joined_tokens, scripted

pytestmark = pytest.mark.real_engine

LONG_TOKENS = 4000
IM_END = 151645
PROMPT = [9707, 11, 1879]


@pytest.fixture
def scaled(parser_class_servers):
    """The `--api-server-count 2` server with a DRAIN_S window; the drain test ends it. The engine
    core's death on two API processes ends another such server, one thrown away anyway: the kimi-k3
    server of tests/engine/test_parser_matrix_real.py."""
    return parser_class_servers[SCALE_OUT]


def test_both_processes_generate_and_their_engine_sockets_stay_on_disk(scaled):
    # A start-up hang, fixed 2026-12-01: vLLM's EngineZmqListeners unlinks its ipc paths when
    # collected; ours was collected after start-up, sometimes before the engine core's asynchronous
    # connects to those paths completed, and then no request on either process ever got an output
    # (2 of ~10 starts here; 2 of 3 when the parent forced a collection, 0 of 6 after the fix).
    with ExitStack() as stack:
        for index in (0, 1):
            client = connection_to(stack, scaled.url, index, timeout_s=30)
            r = client.post(GENERATE, json=scripted(PROMPT, [9707, 11], sampling_params={"max_tokens": 2}), timeout=20)
            assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == [9707, 11], (index, r.text)
    # Unix sockets bound to a path (psutil gives no listen state for them): the engine's input and
    # output listener of each process and our peer sockets.
    paths = {c.laddr for p in _api_processes(scaled.url) for c in p.net_connections(kind="unix") if c.laddr}
    assert len(paths) >= 4, paths
    assert all(os.path.exists(path) for path in paths), {path: os.path.exists(path) for path in paths}


def _metrics_page(url: str) -> str:
    """The merged page from whichever process accepts. Asked while a stream runs on a shared
    two-core machine, its answer once took over httpx's default 5 s: the checks here are of what
    the page says, not of how fast it comes."""
    return httpx.get(url + "/metrics", timeout=60).text


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def _long(request_id: str) -> dict[str, Any]:
    return scripted(PROMPT, [], request_id=request_id, sampling_params={"max_tokens": LONG_TOKENS, "ignore_eos": True})


@pytest.mark.timeout(180, func_only=True)
@pytest.mark.parametrize("holder", [0, 1])
def test_an_abort_by_caller_id_reaches_the_process_holding_the_request(scaled, holder):
    """The orders a real engine reaches only by chance (the id just finished on the receiving
    process, or live on both) are held by gates in tests/app/runtime/test_peers.py."""
    other = 1 - holder
    with ExitStack() as stack:
        stream = StreamReader(connection_to(stack, scaled.url, holder), _long(f"cross-{holder}"))
        stream.wait_events(3)
        assert stream.index == str(holder)
        before = _metric(_metrics_page(scaled.url), "decode_server_peer_aborts_total")
        aborter = connection_to(stack, scaled.url, other)
        r = aborter.post("/abort_requests", json={"request_ids": [f"cross-{holder}"]})
        assert r.status_code == 200 and r.headers[INDEX] == str(other), (r.status_code, r.text)
        stream.join(60)  # a hang guard: missed, the abort would leave it running 4,000 tokens
        trace = [line for line in scaled.log_tail(200_000).splitlines() if f"cross-{holder}" in line or "peer" in line]
        assert not stream.is_alive(), ("the stream did not end within 60 s of its abort", trace[-20:])
        after = _metric(_metrics_page(scaled.url), "decode_server_peer_aborts_total")
    assert finish_reason(stream.payloads()) == "abort" and stream.done(), trace[-20:]
    assert after - before == 1, ("the abort was resolved by the peer process (the cross-process path)", trace[-20:])


@pytest.mark.timeout(120, func_only=True)
def test_an_abort_before_its_request_reaches_whichever_process_gets_the_request(scaled):
    with ExitStack() as stack:
        r = connection_to(stack, scaled.url, 0).post("/abort_requests", json={"request_ids": ["early-x"]})
        assert r.status_code == 200, r.text
        # Process 0 now holds a connection, so this stream goes to process 1: it is remembered there too.
        stream = StreamReader(connection_to(stack, scaled.url, 1), _long("early-x"))
        stream.join(20)
    assert stream.index == "1" and finish_reason(stream.payloads()) == "abort"


@pytest.mark.timeout(120, func_only=True)
def test_a_late_abort_sent_to_another_process_does_not_abort_a_retry(scaled):
    with ExitStack() as stack:
        on_0 = connection_to(stack, scaled.url, 0)
        first = on_0.post(GENERATE, json=scripted(PROMPT, [9707] * 3, request_id="late-x"))
        assert first.status_code == 200 and first.headers[INDEX] == "0", first.text
        r = connection_to(stack, scaled.url, 1).post("/abort_requests", json={"request_ids": ["late-x"]})
        assert r.status_code == 200, r.text
        for client in (on_0, connection_to(stack, scaled.url, 1)):  # the retry, on either process
            retry = client.post(GENERATE, json=scripted(PROMPT, [9707] * 3, request_id="late-x"))
            assert retry.status_code == 200, retry.text
            assert retry.json()["choices"][0]["finish_reason"] == "stop", "process 0 told process 1 it just finished"


@pytest.mark.timeout(180, func_only=True)
def test_metrics_merge_both_processes(scaled):
    before = _metrics_page(scaled.url)
    served = {"0": 0, "1": 0}
    with ExitStack() as stack:
        for index in (0, 1, 0, 1):
            r = connection_to(stack, scaled.url, index).post(GENERATE, json=scripted(PROMPT, [9707] * 2))
            assert r.status_code == 200, r.text
            served[r.headers[INDEX]] += 1
        # Each process renders the merged page; ask both.
        pages = {i: connection_to(stack, scaled.url, i).get("/metrics") for i in (0, 1)}
    assert served == {"0": 2, "1": 2}
    for index, page in pages.items():
        assert page.status_code == 200 and page.headers[INDEX] == str(index)
        text = page.text
        done = _metric(text, "decode_server_requests_total", output_mode="tokens", status="200")
        assert done - _metric(before, "decode_server_requests_total", output_mode="tokens", status="200") == 4
        cpu_series = [l for l in text.splitlines() if l.startswith("decode_server_frontend_cpu_seconds{")]
        assert len(cpu_series) == 2 and all('pid="' in l for l in cpu_series), cpu_series
        assert _metric(text, "decode_server_requests_in_flight") == 0
        assert _metric(text, "decode_server_live_request_states") == 0
        assert "vllm:generation_tokens_total" in text and "vllm:num_requests_running" in text, "vLLM's own series"


def _api_processes(url: str) -> list[psutil.Process]:
    text = _metrics_page(url)
    pids = {int(l.split('pid="')[1].split('"')[0]) for l in text.splitlines() if l.startswith("decode_server_frontend_cpu_seconds{")}
    return [psutil.Process(pid) for pid in pids]


@pytest.mark.timeout(240, func_only=True)
def test_sigterm_drains_streams_on_both_processes_then_all_exit_zero(scaled):
    """Last in this file: it ends the server. Which stream fits the window is the engine's
    speed (four streams on a shared machine), so the short ones are sized from the speed measured
    just before and may end either way; the decision itself is tests/app/process/test_drain.py's, in process."""
    with ExitStack() as stack:
        # Each stream starts on its connection as soon as that is found: a kept-alive connection
        # left idle for uvicorn's keep-alive timeout (5 s) while the next one is searched for is
        # closed by the server, and the request then reconnects to whichever process is least loaded.
        longs = {i: StreamReader(connection_to(stack, scaled.url, i), _long(f"drain-long-{i}")) for i in (0, 1)}
        for s in longs.values():
            s.wait_events(3)
        speeds = [s.tokens_per_s() for s in longs.values()]
        short_script = [9707] * max(2, int(min(speeds) * DRAIN_S / 4))
        shorts = {
            i: StreamReader(connection_to(stack, scaled.url, i), scripted(PROMPT, short_script, request_id=f"drain-short-{i}"))
            for i in (0, 1)
        }
        for s in shorts.values():
            s.wait_events(1)
        in_flight = [not s.done() for s in shorts.values()]
        code, elapsed, alive = sigterm_and_wait(scaled, [*longs.values(), *shorts.values()])
    ends = {i: (finish_reason(longs[i].payloads()), finish_reason(shorts[i].payloads())) for i in (0, 1)}
    print(f"{speeds} tokens/s; {len(short_script)}-token shorts in flight at SIGTERM: {in_flight}; "
          f"(long, short) ends by process: {ends}; all exited after {elapsed:.1f} s")
    assert {s.index for s in longs.values()} == {s.index for s in shorts.values()} == {"0", "1"}
    for i, (long_end, short_end) in ends.items():
        assert long_end == "abort", f"process {i}: left at the deadline, it ends with abort ('length': raise LONG_TOKENS)"
        assert short_end in ("stop", "abort"), f"process {i}: {short_end}"
        if short_end == "stop":
            assert joined_tokens(shorts[i].payloads()) == short_script + [IM_END]
        assert longs[i].done() and shorts[i].done()
    assert code == 0, scaled.log_tail()
    assert not alive, f"every API process and the engine core exit: {alive}"
    assert DRAIN_S <= elapsed < DRAIN_S + DRAIN_FLUSH_S + 60, elapsed
