"""Streams on a loaded host (issue 30): with two CPU-bound processes beside the server, our derender
stream still sends one event per engine step, and its message is the one an unloaded stream gives.

Why it can go wrong: a reader that falls behind the engine gets the steps it missed from vLLM's
output collector as one merged delta, and some of vLLM's parsers (granite's reasoning parser among
them) lose text on a multi-token delta. Our engine's processes once ran in a session of their own,
which Linux's autogroup scheduling makes a CPU scheduling group of its own: under contention the
API process then got a smaller share against the engine, lagged, and merged steps (3, 4, 18 events
for a 25-step stream; decode_server/process/engine_session.py).

The package's server shares the test's session (tests/engine/decode/conftest.py), as processes
started from one shell or in one container do, and so do the hogs. The reference is the number of
steps itself (one event per script token), not a second server: vLLM's own server kept one event
per step under the same load, and what its parsers make of merged steps is checked in process
(tests/app/generate/test_derender_chunking.py, granite's parser fed merged steps).
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
from tests.support import scripted, sse_events

pytestmark = pytest.mark.real_engine

PROMPT = [9707, 1879]
# The package server's reasoning parser (qwen3) on ~40 steps of reasoning and an answer.
TEXT = (
    "<think>\nWeigh it — carefully. Two and two make four, and four is what the user asked"
    " about, so the answer is short.\n</think>\n\nThe answer is four."
)
STREAMS = 10  # at once, as a decode pool runs them
HOGS = 2
# A role chunk, a usage chunk, the end-of-sequence step: what a stream sends beside its steps.
EVENTS_TOLERANCE = 2


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` busy loops in the test's session (its scheduling group, the server's too)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(10)


def _deltas(url: str, script: list[int]) -> list[dict[str, Any]]:
    events = sse_events(url, scripted(PROMPT, script, output_mode="derender", parse_context={}))
    assert events[-1] == "[DONE]"
    return [c["delta"] for e in events[:-1] for c in e.get("choices", [])]


def test_under_cpu_load_each_stream_has_an_event_per_step_and_the_unloaded_message(server, tokenizer):
    script = cc.script_for(tokenizer, TEXT)
    unloaded_deltas = _deltas(server.url, script)
    unloaded = cc.accumulate(unloaded_deltas)
    assert unloaded["reasoning"] and unloaded["content"], unloaded
    # `{}` where the parser held a step back: a delta per step, so merging shows as fewer deltas.
    assert abs(len(unloaded_deltas) - len(script)) <= EVENTS_TOLERANCE, (len(unloaded_deltas), len(script))

    with cpu_hogs(HOGS), concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        loaded = list(pool.map(lambda _: _deltas(server.url, script), range(STREAMS)))
    rows = [(len(deltas), cc.accumulate(deltas)) for deltas in loaded]
    summary = "\n".join(f"{n} events for {len(script)} steps; reasoning {m['reasoning']!r}" for n, m in rows)
    assert all(abs(n - len(script)) <= EVENTS_TOLERANCE for n, _ in rows), f"a loaded stream merged steps:\n{summary}"
    assert all(m == unloaded for _, m in rows), f"a loaded stream's message differs from the unloaded one {unloaded}:\n{summary}"
