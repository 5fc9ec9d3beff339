"""Faults at the transport and around aborts (issue #15, items 2-4), on the package's real engine
(tests/engine/decode/conftest.py); its end, the engine core killed mid-stream, is the package's last
module (test_the_end.py). The abort registry's orders without an engine: tests/app/runtime/test_abort_registry.py.

Each test states the bound it guarantees; docs/operations.md's Reliability table repeats it. The
package's server shortens the transport bounds through their environment variables (the production
defaults are in decode_server/config.py): a request head must be complete in 3 s (default 10),
a stream whose client reads nothing is cut after 3 s (default 60), and kept-alive connections
idle for 60 s (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5) so 1,000 of them can be held.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
import time
from typing import Any

import httpx
import psutil
import pytest

from tests.engine.decode.conftest import HEAD_TIMEOUT_S, SLOTS
from tests.support import servers
from tests.support import GENERATE, scripted

pytestmark = [pytest.mark.real_engine, pytest.mark.reliability]

MIB = 1024 * 1024
PROMPT = [9707, 1879]
IM_END = 151645
LONG = {"max_tokens": 3000, "ignore_eos": True}
GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "decode_server_requests_in_flight",
    "decode_server_live_request_states",
)


@pytest.fixture(scope="module")
def faults(server):
    _warm_up(server)
    return server


# ---------------------------------------------------------------- helpers


def _parse_metrics(text: str) -> dict[str, float]:
    def total(name: str) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((name + " ", name + "{"))
        )

    return {name: total(name) for name in GAUGES}


def _gauges(url: str) -> dict[str, float]:
    return _parse_metrics(httpx.get(url + "/metrics", timeout=60).text)


async def _agauges(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    return _parse_metrics((await client.get(url + "/metrics")).text)


def _status_count(url: str, status: str) -> float:
    text = httpx.get(url + "/metrics", timeout=60).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("decode_server_requests_total{") and f'status="{status}"' in line
    )


def _wait_idle(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        values = _gauges(url)
        if not any(values.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle after {seconds}s: {values}")
        time.sleep(0.05)


async def _until(client: httpx.AsyncClient, url: str, ready: Any, seconds: float = 30.0) -> float:
    """Poll the gauges until `ready(values)`; return how long it took."""
    start = time.monotonic()
    while True:
        values = await _agauges(client, url)
        if ready(values):
            return time.monotonic() - start
        if time.monotonic() - start > seconds:
            raise AssertionError(f"the server never reached the wanted state: {values}")
        await asyncio.sleep(0.02)


def _rss(server: servers.Server) -> int:
    return psutil.Process(server.proc.pid).memory_info().rss


def _log_offset(server: servers.Server) -> int:
    return server.log_path.stat().st_size


def _log_since(server: servers.Server, offset: int) -> str:
    with open(server.log_path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _access_line(server: servers.Server, request_id: str, offset: int = 0, seconds: float = 10.0) -> dict[str, str]:
    pattern = re.compile(rf"decode_server\.access: request_id={re.escape(request_id)} (.*)")
    deadline = time.monotonic() + seconds
    while True:
        for line in _log_since(server, offset).splitlines():
            if m := pattern.search(line):
                return dict(kv.split("=", 1) for kv in m.group(1).split())
        if time.monotonic() > deadline:
            raise AssertionError(f"no access line for {request_id}")
        time.sleep(0.1)


def _stream_body(body: dict[str, Any]) -> bytes:
    return json.dumps({**body, "stream": True}).encode()


def _head(path: str, length: int, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: faults", "Content-Type: application/json", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_to_eof(sock: socket.socket, seconds: float) -> bytes:
    sock.settimeout(seconds)
    data = bytearray()
    try:
        while chunk := sock.recv(1 << 20):
            data += chunk
    except ConnectionResetError:
        pass
    return bytes(data)


def _warm_up(server: servers.Server) -> None:
    """One request of each mode first, so lazy imports and first-use caches are not counted as growth."""
    for mode in ("tokens", "text", "derender"):
        body = scripted(PROMPT, [9707, 11, 1879], output_mode=mode)
        if mode == "derender":
            body["parse_context"] = {"chat_template_kwargs": {"enable_thinking": False}}
        for stream in (False, True):
            r = httpx.post(server.url + GENERATE, json={**body, "stream": stream}, timeout=300)
            assert r.status_code == 200, r.text


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    async with client.stream("POST", url + GENERATE, json={**body, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def _finish(chunks: list[dict[str, Any]]) -> str | None:
    reasons = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c.get("finish_reason")]
    return reasons[-1] if reasons else None


def _tokens(chunks: list[dict[str, Any]]) -> list[int]:
    return [t for chunk in chunks for c in chunk["choices"] for t in c.get("token_ids") or []]


# ---------------------------------------------------------------- transport (item 2)


@pytest.mark.timeout(240, func_only=True)
def test_1000_idle_keepalive_connections_and_256_live_streams_within_64_mib(faults):
    url = faults.url
    rss_before = _rss(faults)

    async def idle_connection() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", faults.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: faults\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 200"), head
        return reader, writer

    async def still_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"GET /health HTTP/1.1\r\nHost: faults\r\n\r\n")
        return (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)).startswith(b"HTTP/1.1 200")

    async def run() -> tuple[int, list[str | None], int]:
        idle = []
        for _ in range(10):
            idle += await asyncio.gather(*(idle_connection() for _ in range(100)))
        limits = httpx.Limits(max_connections=300, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=180, limits=limits) as client:
            modes = ["tokens", "text", "derender"]
            bodies = [
                scripted(PROMPT, [], request_id=f"held-{i}", output_mode=modes[i % 3], sampling_params=LONG,
                         parse_context={"chat_template_kwargs": {"enable_thinking": False}} if i % 3 == 2 else None)
                for i in range(256)
            ]
            streams = [asyncio.create_task(_stream(client, url, b)) for b in bodies]
            await _until(client, url, lambda m: m["decode_server_requests_in_flight"] >= 256, 120)
            peak = _rss(faults)
            # Held past the head timeout: kept-alive idle connections are uvicorn's keep-alive's, not cut.
            hold_until = time.monotonic() + HEAD_TIMEOUT_S + 1
            while time.monotonic() < hold_until:
                peak = max(peak, _rss(faults))
                await asyncio.sleep(0.2)
            answered = sum(await asyncio.gather(*(still_answers(r, w) for r, w in idle)))
            peak = max(peak, _rss(faults))
            r = await client.post(url + "/abort_requests", json={"request_ids": [b["request_id"] for b in bodies]})
            assert r.status_code == 200
            finishes = [_finish(c) for c in await asyncio.wait_for(asyncio.gather(*streams), 120)]
        for _, writer in idle:
            writer.close()
        return peak, finishes, answered

    peak, finishes, answered = asyncio.run(run())
    growth = peak - rss_before
    print(f"RSS before {rss_before / MIB:.1f} MiB, peak with 1,000 idle + 256 streams +{growth / MIB:.1f} MiB")
    assert answered == 1000
    assert finishes == ["abort"] * 256
    assert growth < 64 * MIB, growth
    _wait_idle(url, 5.0)
    assert _rss(faults) - rss_before < 64 * MIB


@pytest.mark.timeout(120, func_only=True)
def test_a_head_sent_byte_by_byte_is_cut_at_the_head_timeout_and_others_run_at_normal_speed(faults):
    url = faults.url
    body = scripted(PROMPT, [9707, 11, 1879, 0, 1], output_mode="text")

    async def normal(client: httpx.AsyncClient) -> float:
        start = time.monotonic()
        chunks = await _stream(client, url, body)
        assert _finish(chunks) == "stop" and _tokens(chunks) == [9707, 11, 1879, 0, 1, IM_END]
        return time.monotonic() - start

    async def slow_client(drip: bool) -> tuple[float, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", faults.port)
        start = time.monotonic()
        head = _head(GENERATE, 100, "X-Padding: " + "a" * 200)  # 60 s at 4 bytes a second

        async def dripping() -> None:
            for byte in head:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.25)

        dripper = asyncio.create_task(dripping()) if drip else None
        try:
            data = await asyncio.wait_for(reader.read(), HEAD_TIMEOUT_S + 20)
        except ConnectionResetError:
            data = b""
        finally:
            if dripper is not None:
                dripper.cancel()
            writer.close()
        return time.monotonic() - start, data

    async def run() -> tuple[float, float, list[tuple[float, bytes]]]:
        async with httpx.AsyncClient(timeout=60) as client:
            baseline = min([await normal(client) for _ in range(3)])
            slow = [asyncio.create_task(slow_client(drip=i > 0)) for i in range(21)]  # one silent, 20 dripping
            await asyncio.sleep(1.0)
            during = max([await normal(client) for _ in range(3)])
            return baseline, during, await asyncio.gather(*slow)

    baseline, during, slow = asyncio.run(run())
    print(f"normal stream {baseline * 1000:.0f} ms alone, {during * 1000:.0f} ms (worst of 3) beside 21 slow heads; "
          f"slow heads cut after {min(t for t, _ in slow):.2f}-{max(t for t, _ in slow):.2f} s")
    for elapsed, data in slow:
        assert data == b""  # closed without an answer
        assert HEAD_TIMEOUT_S - 0.5 <= elapsed <= HEAD_TIMEOUT_S + 5, elapsed
    assert during < 2 * baseline + 2.0, (baseline, during)
    _wait_idle(url, 5.0)


@pytest.mark.timeout(300, func_only=True)
def test_a_stalled_reader_costs_flat_memory_and_is_cut_after_the_send_timeout(faults):
    """3,000 tokens with 20 logprobs each (~6 MB of SSE) to a client that reads nothing.

    The cut needs the server's socket buffers full. Linux sizes a connection's send buffer from its
    segment size: at loopback's (64 KiB) it takes ~3 MB, ~1,500 tokens, minutes for a loaded
    engine; at an Ethernet-sized segment (what a remote client has) ~150 KB, ~80 tokens. The
    cut's timing is checked to the second in process (tests/app/http/test_stall.py)."""
    url = faults.url
    offset = _log_offset(faults)
    body = scripted(PROMPT, [], request_id="stalled-reader", output_mode="text", sampling_params={**LONG, "logprobs": 20})
    raw = _stream_body(body)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1460)
    sock.connect(("127.0.0.1", faults.port))
    try:
        rss_before = _rss(faults)
        sock.sendall(_head(GENERATE, len(raw)) + raw)
        peak, start, deadline = rss_before, time.monotonic(), time.monotonic() + 240
        while _gauges(url)["decode_server_requests_in_flight"] > 0 or time.monotonic() - start < 1:
            assert time.monotonic() < deadline, "the stalled stream was never cut"
            peak = max(peak, _rss(faults))
            time.sleep(0.25)
        cut_after = time.monotonic() - start
        line = _access_line(faults, "stalled-reader", offset)
        received = _read_to_eof(sock, 30)  # what the kernel buffered for it, then the server's close
    finally:
        sock.close()
    growth = peak - rss_before
    print(f"stalled reader: cut after {cut_after:.1f} s at {line['output_tokens']} tokens, "
          f"{len(received) / MIB:.2f} MiB were in socket buffers, RSS peak +{growth / MIB:.2f} MiB")
    assert line["status"] == "499"
    assert int(line["output_tokens"]) < 3000  # the engine request was aborted, not run to the end
    assert "stream cut: its client read nothing" in _log_since(faults, offset)
    assert b"data: [DONE]" not in received
    assert growth < 64 * MIB, growth
    # The server is fine afterwards.
    _wait_idle(url, 5.0)

    async def after() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await _stream(client, url, scripted(PROMPT, [9707, 11], output_mode="text"))

    chunks = asyncio.run(after())
    assert _finish(chunks) == "stop" and _tokens(chunks) == [9707, 11, IM_END]
    _wait_idle(url, 5.0)


@pytest.mark.timeout(120, func_only=True)
def test_connections_dropped_before_their_body_leave_no_error_and_no_state(faults):
    url = faults.url
    offset = _log_offset(faults)
    internal_before = _status_count(url, "500")
    raw = json.dumps(scripted(PROMPT, [], sampling_params=LONG)).encode()

    async def one(kind: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", faults.port)
        if kind == 1:
            writer.write(b"POST /inference/v1/gen")
        elif kind == 2:
            writer.write(_head(GENERATE, len(raw)))
        elif kind >= 3:
            writer.write(_head(GENERATE, len(raw)) + raw[: len(raw) // 2])
        await writer.drain()
        await asyncio.sleep(0.05 * (kind % 3))
        if kind == 4:  # reset, not a clean close
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    async def run() -> None:
        await asyncio.gather(*(one(i % 5) for i in range(500)))

    asyncio.run(run())
    time.sleep(1.0)
    _wait_idle(url, 5.0)
    log = _log_since(faults, offset)
    assert "Traceback" not in log and " ERROR " not in log and "Exception" not in log, log[-3000:]
    assert _status_count(url, "500") == internal_before
    r = httpx.post(url + GENERATE, json=scripted(PROMPT, [9707]), timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == [9707, IM_END]


# ---------------------------------------------------------------- disconnect while queued (item 3)


@pytest.mark.timeout(180, func_only=True)
def test_a_client_gone_while_queued_is_aborted_at_once_and_the_next_queued_request_runs(faults):
    url = faults.url
    offset = _log_offset(faults)
    blockers = [scripted(PROMPT, [], request_id=f"slot-{i}", sampling_params=LONG) for i in range(SLOTS)]
    gone = scripted(PROMPT, [9707, 11], request_id="gone-while-queued")
    nxt = scripted(PROMPT, [9707, 11, 1879], request_id="next-in-queue")

    async def run() -> tuple[float, float, int, list[dict[str, Any]]]:
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            held = [asyncio.create_task(_stream(client, url, b)) for b in blockers]
            await _until(client, url, lambda m: m["vllm:num_requests_running"] >= SLOTS)
            leaving = asyncio.create_task(_stream(client, url, gone))
            await _until(client, url, lambda m: m["vllm:num_requests_waiting"] >= 1)
            waiting = asyncio.create_task(_stream(client, url, nxt))
            await _until(client, url, lambda m: m["vllm:num_requests_waiting"] >= 2)
            assert (await _agauges(client, url))["decode_server_requests_in_flight"] == SLOTS + 2
            leaving.cancel()  # the client closes its connection before its first token
            # "At once" is causal, not a stopwatch: the engine entry goes while every slot is still
            # held, so nothing but the disconnect can have removed it (10 s: only the hang bound).
            dropped = await _until(
                client, url,
                lambda m: m["vllm:num_requests_waiting"] <= 1 and m["decode_server_requests_in_flight"] <= SLOTS + 1, 10,
            )
            slots_then = (await _agauges(client, url))["vllm:num_requests_running"]
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
    assert _finish(chunks) == "stop" and _tokens(chunks) == [9707, 11, 1879, IM_END]
    line = _access_line(faults, "gone-while-queued", offset)
    assert line["status"] == "499" and line["output_tokens"] == "0"
    assert _access_line(faults, "next-in-queue", offset)["status"] == "200"
    _wait_idle(url, 5.0)


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
        sock.sendall(_head(GENERATE, len(raw), f"X-Request-Id: {rid}", "Connection: close") + raw[:-1])
        time.sleep(0.2)
        assert httpx.post(url + "/abort_requests", json={"request_ids": [rid]}, timeout=10).status_code == 200
        start = time.monotonic()
        sock.sendall(raw[-1:])
        response = _read_to_eof(sock, 30)
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
    _wait_idle(url, 5.0)


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
                chunks = await _stream(client, url, body)
                return _finish(chunks), len(_tokens(chunks))
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
    _wait_idle(url, 5.0)


@pytest.mark.timeout(120, func_only=True)
def test_a_retry_after_a_late_abort_runs_normally(faults):
    url = faults.url
    body = scripted(PROMPT, [9707, 11], request_id="late-abort")
    first = httpx.post(url + GENERATE, json=body, timeout=60).json()["choices"][0]
    assert first["finish_reason"] == "stop"
    assert httpx.post(url + "/abort_requests", json={"request_ids": ["late-abort"]}, timeout=10).status_code == 200
    retry = httpx.post(url + GENERATE, json=body, timeout=60).json()["choices"][0]
    assert retry["finish_reason"] == "stop" and retry["token_ids"] == [9707, 11, IM_END]
    _wait_idle(url, 5.0)
