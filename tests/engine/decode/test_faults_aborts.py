"""Faults around aborts (issue #15, items 3-4), on the package's real engine
(tests/engine/decode/conftest.py): a client gone while queued, an abort that arrives while the body
uploads or races its request, and a retry after a late abort. The package's last module
(test_the_end.py) kills the engine core mid-stream. The abort registry's orders without an engine:
tests/app/runtime/test_abort_registry.py. Each test states the bound it guarantees;
docs/operations.md's Reliability table repeats it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import pytest

from tests.engine.decode.conftest import SLOTS
from tests.support import GENERATE, scripted
from tests.engine.decode.faults import (
    IM_END, LONG, PROMPT, access_line, agauges, finish_of, log_offset, raw_head, read_to_eof, stream_chunks,
    tokens_of, until, wait_idle,
)

pytestmark = [pytest.mark.real_engine, pytest.mark.reliability]


# ---------------------------------------------------------------- disconnect while queued (item 3)


@pytest.mark.timeout(180, func_only=True)
def test_a_client_gone_while_queued_is_aborted_at_once_and_the_next_queued_request_runs(faults):
    url = faults.url
    offset = log_offset(faults)
    blockers = [scripted(PROMPT, [], request_id=f"slot-{i}", sampling_params=LONG) for i in range(SLOTS)]
    gone = scripted(PROMPT, [9707, 11], request_id="gone-while-queued")
    nxt = scripted(PROMPT, [9707, 11, 1879], request_id="next-in-queue")

    async def run() -> tuple[float, float, int, list[dict[str, Any]]]:
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            held = [asyncio.create_task(stream_chunks(client, url, b)) for b in blockers]
            await until(client, url, lambda m: m["vllm:num_requests_running"] >= SLOTS)
            leaving = asyncio.create_task(stream_chunks(client, url, gone))
            await until(client, url, lambda m: m["vllm:num_requests_waiting"] >= 1)
            waiting = asyncio.create_task(stream_chunks(client, url, nxt))
            await until(client, url, lambda m: m["vllm:num_requests_waiting"] >= 2)
            assert (await agauges(client, url))["decode_server_requests_in_flight"] == SLOTS + 2
            leaving.cancel()  # the client closes its connection before its first token
            # "At once" is causal, not a stopwatch: the engine entry goes while every slot is still
            # held, so nothing but the disconnect can have removed it (10 s: only the hang bound).
            dropped = await until(
                client, url,
                lambda m: m["vllm:num_requests_waiting"] <= 1 and m["decode_server_requests_in_flight"] <= SLOTS + 1, 10,
)
            slots_then = (await agauges(client, url))["vllm:num_requests_running"]
            start = time.monotonic()
            await client.post(url + "/abort_requests", json={"request_ids": ["slot-0"]})  # one slot frees
            chunks = await asyncio.wait_for(waiting, 30)
            ran = time.monotonic() - start
            await client.post(url + "/abort_requests", json={"request_ids": [b["request_id"] for b in blockers]})
            await asyncio.wait_for(asyncio.gather(*held), 60)
            return dropped, ran, slots_then, chunks

    dropped, ran, slots_then, chunks = asyncio.run(run())
    print(f"queued request's engine entry gone {dropped * 1000:.0f} ms after its client left; "
          f"the next queued one ran {ran * 1000:.0f} ms after a slot freed")
    assert slots_then == SLOTS, "the queued entry left before any slot freed"
    assert finish_of(chunks) == "stop" and tokens_of(chunks) == [9707, 11, 1879, IM_END]
    line = access_line(faults, "gone-while-queued", offset)
    assert line["status"] == "499" and line["output_tokens"] == "0"
    assert access_line(faults, "next-in-queue", offset)["status"] == "200"
    wait_idle(url, 5.0)


# ---------------------------------------------------------------- abort before the engine has it (item 4)


@pytest.mark.timeout(120, func_only=True)
@pytest.mark.parametrize("stream", [False, True], ids=["batch", "stream"])
def test_an_abort_that_arrives_while_the_body_is_still_uploading_is_not_lost(faults, stream):
    """Deterministic: the abort is answered before the request's last byte is sent."""
    url = faults.url
    rid = f"abort-mid-upload-{'stream' if stream else 'batch'}"
    body = scripted(PROMPT, [], request_id=rid, sampling_params=LONG)
    raw = json.dumps({**body, "stream": stream}).encode()
    with socket.create_connection(("127.0.0.1", faults.port)) as sock:
        sock.sendall(raw_head(GENERATE, len(raw), f"X-Request-Id: {rid}", "Connection: close") + raw[:-1])
        time.sleep(0.2)
        assert httpx.post(url + "/abort_requests", json={"request_ids": [rid]}, timeout=10).status_code == 200
        start = time.monotonic()
        sock.sendall(raw[-1:])
        response = read_to_eof(sock, 30)
    elapsed = time.monotonic() - start
    head, _, payload = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), response[:500]
    if stream:
        assert b'"finish_reason":"abort"' in payload and b"data: [DONE]" in payload, payload[-500:]
        assert payload.count(b'"token_ids":[') <= 2
    else:
        choice = json.loads(payload)["choices"][0]
        assert choice["finish_reason"] == "abort" and len(choice["token_ids"]) < 3000
    assert elapsed < 5.0
    wait_idle(url, 5.0)


@pytest.mark.timeout(180, func_only=True)
def test_an_abort_racing_its_request_always_ends_it_quickly(faults):
    """Abort sent before, with, or just after the request (ms apart): every one ends "abort",
    none runs its 3,000 tokens."""
    url = faults.url
    delays = [-0.02, 0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05]

    async def one(client: httpx.AsyncClient, control: httpx.AsyncClient, rid: str, stream: bool, delay: float):
        body = scripted(PROMPT, [], request_id=rid, sampling_params=LONG)

        async def abort() -> None:
            assert (await control.post(url + "/abort_requests", json={"request_ids": [rid]})).status_code == 200

        async def send() -> tuple[str | None, int]:
            if stream:
                chunks = await stream_chunks(client, url, body)
                return finish_of(chunks), len(tokens_of(chunks))
            r = await client.post(url + GENERATE, json=body)
            choice = r.json()["choices"][0]
            return choice["finish_reason"], len(choice["token_ids"])

        start = time.monotonic()
        if delay < 0:
            await abort()
            await asyncio.sleep(-delay)
            result = await send()
        else:
            request = asyncio.create_task(send())
            await asyncio.sleep(delay)
            await abort()
            done, _ = await asyncio.wait({request}, timeout=15)
            assert done, f"{rid}: not aborted within 15 s"
            result = request.result()
        return (rid, *result, time.monotonic() - start)

    async def run() -> list[tuple[str, str | None, int, float]]:
        async with httpx.AsyncClient(timeout=120) as client, httpx.AsyncClient(timeout=30) as control:
            await client.get(url + "/health")
            await control.get(url + "/health")
            out = []
            for stream in (False, True):
                for i, delay in enumerate(delays):
                    out.append(await one(client, control, f"race-{int(stream)}-{i}", stream, delay))
            return out

    results = asyncio.run(run())
    print("abort races (id, finish, tokens, s):", [(r, f, n, round(t, 2)) for r, f, n, t in results])
    for rid, finish, tokens, elapsed in results:
        assert finish == "abort" and tokens < 3000 and elapsed < 10.0, (rid, finish, tokens, elapsed)
    wait_idle(url, 5.0)


@pytest.mark.timeout(120, func_only=True)
def test_a_retry_after_a_late_abort_runs_normally(faults):
    url = faults.url
    body = scripted(PROMPT, [9707, 11], request_id="late-abort")
    first = httpx.post(url + GENERATE, json=body, timeout=60).json()["choices"][0]
    assert first["finish_reason"] == "stop"
    assert httpx.post(url + "/abort_requests", json={"request_ids": ["late-abort"]}, timeout=10).status_code == 200
    retry = httpx.post(url + GENERATE, json=body, timeout=60).json()["choices"][0]
    assert retry["finish_reason"] == "stop" and retry["token_ids"] == [9707, 11, IM_END]
    wait_idle(url, 5.0)
