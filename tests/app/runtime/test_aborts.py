"""Aborts, disconnects and the bookkeeping after them, in process: deterministic where a real engine
needs timing (a gate holds the request exactly where the test acts).

The real-engine checks that stay: test_operations (an abort mid-stream through the typed client),
test_faults (clients gone while queued, connections dropped), test_reliability's disconnect storm.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.support.inprocess import body_for, serve
from tests.support import GENERATE, choice_chunks, joined_text, joined_tokens

pytestmark = pytest.mark.anyio

SCRIPT = [9707, 11, 1879, 0]  # "Hello, world!"


def body(mode: str = "tokens", **fields):
    return body_for(mode, SCRIPT, **fields)


# ------------------------------------------------------------------ aborts and bookkeeping


async def test_abort_by_caller_id_ends_the_stream_with_abort_and_counts_it(inproc):
    gate = inproc.core.hold("ab-1", after_tokens=2)
    stream = asyncio.create_task(inproc.events(body(request_id="ab-1")))
    await gate.reached()
    r = await inproc.client.post("/abort_requests", json={"request_ids": ["ab-1", "nobody"]})
    assert (r.status_code, r.content) == (200, b"")
    events = await asyncio.wait_for(stream, 10)
    assert [c["token_ids"] for e in events[:-1] for c in e["choices"]] == [[SCRIPT[0]], [SCRIPT[1]], []]
    assert events[-2]["choices"][0]["finish_reason"] == "abort"
    assert await inproc.metric("decode_server_aborts_total", cause="abort_endpoint") == 1
    assert await inproc.metric("decode_server_aborts_total", cause="engine_abort") == 1
    assert await inproc.metric("decode_server_requests_total", output_mode="tokens", status="200") == 1
    assert await inproc.metric("decode_server_requests_in_flight") == 0
    assert inproc.engine.live_request_count() == 0


async def test_abort_of_a_queued_request_twice_and_of_an_unknown_id(inproc):
    gate = inproc.core.hold("queued")
    stream = asyncio.create_task(inproc.events(body("derender", request_id="queued")))
    await gate.reached()
    assert inproc.core.waiting == [inproc.core.seen[-1].external_req_id]
    assert await inproc.metric("vllm:num_requests_waiting") == 1
    for _ in range(2):
        r = await inproc.client.post("/inference/v1/abort_requests", json={"request_ids": ["queued", "nobody"]})
        assert r.status_code == 200
    events = await asyncio.wait_for(stream, 10)
    assert events[-2]["choices"][0]["finish_reason"] == "abort"
    assert sum(len(c["token_ids"] or []) for e in events[:-1] for c in e["choices"]) == 0
    assert inproc.core.waiting == [] and inproc.engine.live_request_count() == 0
    assert await inproc.metric("vllm:num_requests_waiting") == 0


async def test_abort_of_a_batch_request_returns_its_partial_output(inproc):
    gate = inproc.core.hold("batch-abort", after_tokens=2)
    pending = asyncio.create_task(inproc.client.post(GENERATE, json=body("text", request_id="batch-abort")))
    await gate.reached()
    await inproc.client.post("/abort_requests", json={"request_ids": ["batch-abort"]})
    choice = (await pending).json()["choices"][0]
    assert (choice["token_ids"], choice["text"], choice["finish_reason"]) == (SCRIPT[:2], "Hello,", "abort")


async def test_a_stream_client_that_goes_away_is_aborted_and_counted_as_499(inproc):
    gate = inproc.core.hold("gone", after_tokens=1)
    async with inproc.client.stream("POST", GENERATE, json={**body(request_id="gone"), "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                break
        await gate.reached()
    # Leaving the block closed the response: the app saw http.disconnect and finished.
    assert inproc.core.aborted and inproc.core.running == []
    assert inproc.engine.live_request_count() == 0
    assert await inproc.metric("decode_server_requests_total", output_mode="tokens", status="499") == 1
    assert await inproc.metric("decode_server_aborts_total", cause="client_disconnect") == 1
    assert await inproc.metric("decode_server_requests_in_flight") == 0


async def test_a_batch_client_that_goes_away_is_aborted(inproc):
    gate = inproc.core.hold("gone")
    pending = asyncio.create_task(inproc.client.post(GENERATE, json=body(request_id="gone")))
    await gate.reached()
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert inproc.core.aborted and inproc.core.waiting == []
    assert await inproc.metric("decode_server_requests_total", output_mode="tokens", status="499") == 1
    assert inproc.engine.live_request_count() == 0


async def test_load_counts_admitted_requests_until_they_end(demo_model):
    async with serve(demo_model, "--enable-server-load-tracking") as s:
        gate = s.core.hold("busy")
        pending = asyncio.create_task(s.client.post(GENERATE, json=body(request_id="busy")))
        await gate.reached()
        assert (await s.client.get("/load")).json() == {"server_load": 1}
        assert await s.metric("decode_server_requests_in_flight", output_mode="tokens") == 1
        gate.release()
        assert (await pending).status_code == 200
        assert (await s.client.get("/load")).json() == {"server_load": 0}
        assert await s.metric("decode_server_time_to_first_token_seconds_count", output_mode="tokens") == 1
async def test_a_text_stream_aborted_while_queued_is_one_chunk_with_only_a_finish_reason(inproc):
    gate = inproc.core.hold("text-abort")
    stream = asyncio.create_task(inproc.events(body("text", request_id="text-abort")))
    await gate.reached()
    await inproc.client.post("/abort_requests", json={"request_ids": ["text-abort"]})
    chunks = (await asyncio.wait_for(stream, 10))[:-1]
    assert len(chunks) == 1
    last = chunks[0]["choices"][0]
    assert (last["finish_reason"], last["token_ids"], last["text"]) == ("abort", [], "")


async def test_an_abort_mid_stream_flushes_held_back_text(inproc, tokenizer):
    # "ab" might start the stop string "abc...": it is held back, then flushed by the abort.
    script = tokenizer.encode("xyz ab", add_special_tokens=False)
    gate = inproc.core.hold("held-abort", after_tokens=len(script))
    held = body_for("text", script + [1] * 50, request_id="held-abort", sampling_params={"stop": ["ab" + "c" * 30]})
    stream = asyncio.create_task(inproc.events(held))
    await gate.reached()
    await inproc.client.post("/abort_requests", json={"request_ids": ["held-abort"]})
    events = await asyncio.wait_for(stream, 10)
    assert choice_chunks(events)[-1]["finish_reason"] == "abort"
    assert joined_tokens(events) == script
    assert joined_text(events) == tokenizer.decode(script) == "xyz ab"


async def test_an_abort_mid_reasoning_ends_the_stream_with_abort(inproc, tokenizer):
    script = tokenizer.encode("<think>\n" + "thinking " * 50, add_special_tokens=False)
    gate = inproc.core.hold("derender-abort", after_tokens=5)
    thinking = body_for("derender", script, request_id="derender-abort", parse_context={})
    stream = asyncio.create_task(inproc.events(thinking))
    await gate.reached()
    await inproc.client.post("/inference/v1/abort_requests", json={"request_ids": ["derender-abort"]})
    chunks = choice_chunks(await asyncio.wait_for(stream, 10))
    assert chunks[-1]["finish_reason"] == "abort"
    deltas = [c["delta"] for c in chunks]
    assert not any(d.get("content") for d in deltas)
    assert "".join(d.get("reasoning") or "" for d in deltas).lstrip().startswith("thinking")


async def test_a_disconnect_storm_leaves_no_state(demo_model):
    """200 streams over the three levels, dropped at random points (before the first token too)."""
    rng = random.Random(7)
    async with serve(demo_model, "--reasoning-parser", "qwen3") as s:
        s.core.step_interval_s = 0.001  # so drops land mid-stream

        async def stream_then_drop(i: int, keep: int) -> None:
            long = body_for(("tokens", "text", "derender")[i % 3], [], sampling_params={"max_tokens": 2000, "ignore_eos": True})
            async with s.client.stream("POST", GENERATE, json={**long, "stream": True}) as r:
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen >= keep:
                        return

        tasks = []
        for i in range(200):
            keep = rng.choice([0, 1, 2, 5, 20])
            task = asyncio.create_task(stream_then_drop(i, keep or 10**9))
            if keep == 0:  # gone before (or right after) its first token
                asyncio.get_running_loop().call_later(rng.uniform(0, 0.05), task.cancel)
            tasks.append(task)
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        for _ in range(100):
            if s.engine.live_request_count() == 0 and not s.core.running and not s.core.waiting:
                break
            await asyncio.sleep(0.02)
        assert (s.engine.live_request_count(), s.core.running, s.core.waiting) == (0, [], [])
        assert await s.metric("decode_server_requests_in_flight") == 0
        assert await s.metric("decode_server_requests_total", status="499") == 200
        assert await s.metric("vllm:num_requests_running") == 0
