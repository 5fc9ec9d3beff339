"""Streams on a loaded host (issue 30): with two CPU-bound processes beside the servers, our derender
stream sends one event per engine step as vLLM's own coupled chat does, and its message is the one
an unloaded stream gives.

Why it can go wrong: a reader that falls behind the engine gets the steps it missed from vLLM's
output collector as one merged delta, and some of vLLM's parsers (granite's reasoning parser among
them) lose text on a multi-token delta. Our engine's processes once ran in a session of their own,
which Linux's autogroup scheduling makes a CPU scheduling group of its own: under contention the
API process then got a smaller share against the engine, lagged, and merged steps where vLLM's
server (engine in its own session's group) did not (decode_server/process/engine_session.py).

The servers and the CPU hogs share the test's session, as processes started from one shell or in
one container do: with the engine in a session of its own, the engine got a scheduling group's
share of the CPU to itself while our API process shared one with the hogs (3, 4, 18 events for a
25-step stream); vLLM's server keeps its engine in its own session and did not merge.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import chat_cases as cc
from tests.support import servers
from tests.support import sse_events

pytestmark = pytest.mark.real_engine

GRANITE = ["--reasoning-parser", "granite"]
# Granite's reasoning parser loses the reasoning when one delta carries several of these tokens.
TEXT = (
    "Here is my thought process:\nWeigh it — carefully. Two and two make four, and four is what the user asked"
    " about, so the answer is short.\nHere is my response:\nThe answer is four."
)
STREAMS = 10  # at once on each server, as a decode pool runs them
HOGS = 2
# A role chunk or a usage chunk one side sends and the other does not.
EVENTS_TOLERANCE = 2


@pytest.fixture(scope="module")
def granite_servers(demo_model, log_dir) -> Iterator[tuple[servers.Server, servers.Server]]:
    """Ours and vLLM's own, both with granite's reasoning parser, started side by side."""
    pair = (
        servers.ours("granite-ours", demo_model, log_dir, *GRANITE),
        servers.vllms_own("granite-vllm", demo_model, log_dir, *GRANITE),
    )
    for server in pair:
        server.own_session = False  # beside the hogs, in the test's scheduling group
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(server.start) for server in pair]:
                started.result()
        yield pair
    finally:
        for server in pair:
            server.stop()


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` busy loops in the test's session (its scheduling group, the servers' too)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(10)


def _deltas(events: list[Any]) -> list[dict[str, Any]]:
    return [c["delta"] for e in events if isinstance(e, dict) for c in e.get("choices", [])]


def _ours(ours: servers.Server, vllm: servers.Server, script: list[int]) -> list[dict[str, Any]]:
    events = sse_events(ours.url, cc.derender_request(vllm.url, cc.chat_body(), script))
    assert events[-1] == "[DONE]"
    return _deltas(events[:-1])


def _theirs(vllm: servers.Server, script: list[int]) -> list[dict[str, Any]]:
    # return_token_ids: a chunk for every engine step, `{}` where the parser held the step back, as ours.
    return _deltas(cc.coupled_chat(vllm.url, {**cc.chat_body(), "return_token_ids": True}, script, stream=True))


def test_under_cpu_load_each_stream_has_vllms_events_and_the_unloaded_message(granite_servers, tokenizer):
    ours, vllm = granite_servers
    script = cc.script_for(tokenizer, TEXT)
    unloaded = cc.accumulate(_ours(ours, vllm, script))
    assert unloaded["reasoning"] == cc.accumulate(_theirs(vllm, script))["reasoning"], "the unloaded streams agree"
    assert unloaded["reasoning"] and unloaded["content"], unloaded

    with cpu_hogs(HOGS), concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        # One server at a time: the two do not compete with each other, only with the hogs.
        ours_streams = list(pool.map(lambda _: _ours(ours, vllm, script), range(STREAMS)))
        theirs_streams = list(pool.map(lambda _: _theirs(vllm, script), range(STREAMS)))
    rows = [(len(a), len(b), cc.accumulate(a)) for a, b in zip(ours_streams, theirs_streams)]
    summary = "\n".join(f"ours {a} events, vLLM's {b}; reasoning {m['reasoning']!r}" for a, b, m in rows)
    assert all(abs(a - b) <= EVENTS_TOLERANCE for a, b, _ in rows), f"events per stream differ:\n{summary}"
    assert all(m == unloaded for _, _, m in rows), f"a loaded stream's message differs from the unloaded one {unloaded}:\n{summary}"
