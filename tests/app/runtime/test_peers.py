"""Abort by caller id across API processes (`--api-server-count N`), in process: two apps, each with
its own scripted engine and its end of the peer channel (`runtime/peers.py`, real zmq over ipc), in
the test's loop. Gates hold each request exactly where the test needs it, so the orders that a real
engine reaches only by chance (the same id just finished on one process and live on the other) are
checked every run. The real-engine check is tests/engine/test_scale_out.py.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from decode_server.runtime.peers import Peers
from tests.support.inprocess import body_for, serve
from tests.support.servers import PARSER_FLAGS
from tests.support import GENERATE, finish_reason

pytestmark = pytest.mark.anyio

SCRIPT = [9707, 11, 1879, 0]


@contextlib.asynccontextmanager
async def _two_processes(demo_model, tmp_path):
    addresses = [f"ipc://{tmp_path}/peer-{i}" for i in (0, 1)]
    async with serve(demo_model, *PARSER_FLAGS, peers=Peers(0, addresses)) as first:
        async with serve(demo_model, *PARSER_FLAGS, peers=Peers(1, addresses)) as second:
            yield first, second


async def _held_stream(app, request_id: str) -> asyncio.Task:
    gate = app.core.hold(request_id, after_tokens=1)
    stream = asyncio.create_task(app.events(body_for("tokens", SCRIPT, request_id=request_id)))
    await gate.reached()
    return stream


async def _abort(app, request_id: str) -> None:
    r = await app.client.post("/abort_requests", json={"request_ids": [request_id]})
    assert (r.status_code, r.content) == (200, b"")


async def test_an_abort_reaches_the_other_process(demo_model, tmp_path):
    async with _two_processes(demo_model, tmp_path) as (asker, holder):
        stream = await _held_stream(holder, "cross")
        await _abort(asker, "cross")
        assert finish_reason(await asyncio.wait_for(stream, 10)) == "abort"
        assert asker.core.aborted == [] and len(holder.core.aborted) == 1


async def test_an_id_that_just_finished_here_still_aborts_its_retry_live_on_the_other_process(demo_model, tmp_path):
    """The asker knows the id (its own request by that name ended a moment ago): that says nothing
    about the other process, where the client's retry with the same id runs."""
    async with _two_processes(demo_model, tmp_path) as (asker, holder):
        first = await asker.client.post(GENERATE, json=body_for("tokens", SCRIPT, request_id="dup"))
        assert first.json()["choices"][0]["finish_reason"] == "stop", first.text
        retry = await _held_stream(holder, "dup")
        await _abort(asker, "dup")
        assert finish_reason(await asyncio.wait_for(retry, 10)) == "abort"


async def test_an_id_live_on_both_processes_is_aborted_on_both(demo_model, tmp_path):
    """As in one process, where an abort ends every request the caller sent under that id."""
    async with _two_processes(demo_model, tmp_path) as (first, second):
        streams = [await _held_stream(app, "both") for app in (first, second)]
        await _abort(first, "both")
        for stream in streams:
            assert finish_reason(await asyncio.wait_for(stream, 10)) == "abort"


async def test_a_late_abort_on_the_other_process_spares_a_retry(demo_model, tmp_path):
    """The id finished on one process: an abort sent to the other is late there too (not remembered)."""
    async with _two_processes(demo_model, tmp_path) as (asker, holder):
        first = await holder.client.post(GENERATE, json=body_for("tokens", SCRIPT, request_id="late"))
        assert first.status_code == 200, first.text
        await _abort(asker, "late")
        for app in (asker, holder):
            retry = await app.client.post(GENERATE, json=body_for("tokens", SCRIPT, request_id="late"))
            assert retry.json()["choices"][0]["finish_reason"] == "stop", retry.text
