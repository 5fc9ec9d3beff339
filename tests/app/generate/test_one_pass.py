"""One pass per engine step for every live stream (generate/one_pass.py, issue #30), in process over
the scripted engine, whose AsyncLLM and collectors are vLLM's own: each stream gets one event per
step and one write per event, a writer wakes only for its own events, a stalled reader holds up no
other stream and loses nothing, a disconnect aborts before the next step, and an engine death ends
every stream with the error event. The parity of every event is the differential corpus's
(tests/app/vllm/test_differential.py).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from decode_server.generate import one_pass
from tests.support import GENERATE, choice_chunks, joined_tokens
from tests.support.asgi_stream import StreamingASGITransport
from tests.support.inprocess import body_for, serve
from tests.support.servers import PARSER_FLAGS

pytestmark = pytest.mark.anyio

SCRIPT = [9707, 11, 1879, 0] * 5  # "Hello, world!" × 5: 20 tokens, then EOS
DEAD = "the engine is dead; this server will restart"


def body(mode: str = "tokens", **fields):
    return body_for(mode, SCRIPT, **fields)


async def _counters(s) -> dict[str, float]:
    return {name: await s.metric(f"decode_server_stream_{name}_total") for name in ("passes", "wakeups", "writes")}


async def test_each_stream_gets_one_event_and_one_write_per_step_from_one_pass(inproc):
    before = await _counters(inproc)
    streams = [inproc.events(body(mode, request_id=f"s-{k}-{mode}")) for k in range(4) for mode in ("tokens", "text", "derender")]
    results = await asyncio.wait_for(asyncio.gather(*streams), 30)
    for events in results:
        assert joined_tokens(events) == [*SCRIPT, 151645] and events[-1] == "[DONE]"
        assert all(len(c["token_ids"] or []) <= 1 for c in choice_chunks(events)), "one step, one event"
    after = await _counters(inproc)
    passes, wakeups, writes = (after[k] - before[k] for k in ("passes", "wakeups", "writes"))
    events = sum(len(e) - 1 for e in results)
    # 12 streams in lockstep: ~21 steps, each one pass for all of them.
    assert len(SCRIPT) < passes < 3 * len(SCRIPT), passes
    assert writes <= events, "a step's events go out in one write (several steps' when the writer lags)"
    assert wakeups <= writes, "a writer wakes only for events of its own"


async def test_the_fallback_loops_over_generate_and_sends_the_same_events(demo_model, monkeypatch, inproc):
    expected = {mode: await inproc.events(body(mode, request_id="one-pass")) for mode in ("tokens", "text", "derender")}
    monkeypatch.setenv("DECODE_SERVER_ONE_PASS", "0")
    async with serve(demo_model, *PARSER_FLAGS) as s:
        for mode, events in expected.items():
            got = await s.events(body(mode, request_id="one-pass"))
            assert _without_times(got) == _without_times(events), mode
        assert await s.metric("decode_server_stream_passes_total") == 0


def _without_times(events: list) -> list:
    return [e if e == "[DONE]" else {k: v for k, v in e.items() if k != "created"} for e in events]


async def test_a_stalled_reader_holds_up_no_other_stream_and_loses_nothing(inproc, monkeypatch):
    # A tiny buffer: the stalled stream's output is left to vLLM's collector after its first events.
    monkeypatch.setattr(one_pass, "BUFFER_LIMIT", 1)
    inproc.core.lockstep_timeout_s = 0  # vLLM's engine never waits for a reader; the scripted one need not either
    inproc.core.step_interval_s = 0.005
    release = asyncio.Event()

    async def stalling_app(scope, receive, send):
        sent = 0

        async def stalled_send(message):
            nonlocal sent
            if message["type"] == "http.response.body":
                sent += 1
                if sent > 1:  # the socket takes one write, then its reader stops reading
                    await release.wait()
            await send(message)

        await inproc.app(scope, receive, stalled_send)

    long_script = SCRIPT * 3
    async with httpx.AsyncClient(transport=StreamingASGITransport(stalling_app), base_url="http://t", timeout=30) as slow:
        stalled = asyncio.create_task(_events(slow, body_for("text", long_script, request_id="stalled")))
        while not inproc.core.running:
            await asyncio.sleep(0.001)
        other = await asyncio.wait_for(inproc.events(body("text", request_id="other")), 10)
        assert not stalled.done(), "the stalled reader is still stalled"
        assert len(choice_chunks(other)) == len(SCRIPT) + 1, "the other stream got every step as its own event"
        release.set()
        events = await asyncio.wait_for(stalled, 10)
    assert joined_tokens(events) == [*long_script, 151645], "the stalled stream's merged steps lose nothing"
    assert events[-1] == "[DONE]" and inproc.engine.live_request_count() == 0


async def _events(client: httpx.AsyncClient, payload: dict) -> list:
    out = []
    async with client.stream("POST", GENERATE, json={**payload, "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return out


async def test_a_disconnect_aborts_before_the_next_engine_step(inproc):
    core = inproc.core
    core.step_interval_s = 0.01
    steps = 0
    get_output = core.get_output_async
    abort = core.abort_requests_async
    aborted_at: list[int] = []

    async def counting_get_output():
        nonlocal steps
        out = await get_output()
        steps += 1
        return out

    async def noting_abort(request_ids):
        aborted_at.append(steps)
        await abort(request_ids)

    core.get_output_async, core.abort_requests_async = counting_get_output, noting_abort
    async with inproc.client.stream("POST", GENERATE, json={**body_for("tokens", SCRIPT * 10, request_id="gone"), "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and len(line) > 6:
                break
        left_at = steps
    assert aborted_at and aborted_at[0] - left_at <= 1, (left_at, aborted_at)
    assert core.running == [] and inproc.engine.live_request_count() == 0


async def test_a_client_gone_before_its_first_token_has_its_engine_request_aborted(inproc):
    """The response awaits a stream's first token (it decides the status); a client that leaves
    first cancels that wait, and the abort still reaches the engine, unanswered by it."""
    core = inproc.core
    gate = core.hold("early")
    aborted: list[list[str]] = []
    abort = core.abort_requests_async

    async def noting_abort(request_ids):
        await asyncio.sleep(0.01)  # a send to the engine core that waits on its socket
        aborted.append(list(request_ids))
        await abort(request_ids)

    core.abort_requests_async = noting_abort
    request = asyncio.create_task(inproc.client.post(GENERATE, json={**body(request_id="early"), "stream": True}))
    await gate.reached()
    request.cancel()
    for _ in range(200):
        if inproc.engine.live_request_count() == 0:
            break
        await asyncio.sleep(0.01)
    gate.release()
    assert len(aborted) == 1 and "-early-" in aborted[0][0], aborted
    assert (core.waiting, core.running, inproc.engine.live_request_count()) == ([], [], 0)
    assert await inproc.metric("decode_server_requests_total", status="499") == 1
    assert await inproc.metric("decode_server_aborts_total", cause="client_disconnect") == 1


async def test_an_engine_death_ends_every_stream_with_the_error_event(inproc):
    gates = [inproc.core.hold(f"open-{k}", after_tokens=k + 1) for k in range(3)]
    streams = [asyncio.create_task(inproc.events(body(mode, request_id=f"open-{k}")))
               for k, mode in enumerate(("tokens", "text", "derender"))]
    for gate in gates:
        await gate.reached()
    inproc.core.die()
    for events in await asyncio.wait_for(asyncio.gather(*streams), 10):
        assert events[-2] == {"error": {"message": DEAD, "type": "ServiceUnavailableError", "param": None, "code": 503}}
        assert events[-1] == "[DONE]"
    assert inproc.engine.live_request_count() == 0
