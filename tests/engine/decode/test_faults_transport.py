"""Faults at the transport (issue #15, item 2), on the package's real engine
(tests/engine/decode/conftest.py): 1,000 idle kept-alive connections beside 256 live streams, a head
sent byte by byte, a stalled reader, connections dropped before their body.

Each test states the bound it guarantees; docs/operations.md's Reliability table repeats it. The
package's server shortens the transport bounds through their environment variables (the production
defaults are in decode_server/config.py): a request head must be complete in 3 s (default 10),
a stream whose client reads nothing is cut after 3 s (default 60), and kept-alive connections
idle for 60 s (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5) so 1,000 of them can be held.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from typing import Any

import httpx
import pytest

from tests.engine.decode.conftest import HEAD_TIMEOUT_S
from tests.support import GENERATE, scripted
from tests.engine.decode.faults import (
    IM_END, LONG, MIB, PROMPT, access_line, finish_of, gauges, log_offset, log_since, raw_head, read_to_eof,
    rss, status_count, stream_body, stream_chunks, tokens_of, until, wait_idle,
)

pytestmark = [pytest.mark.real_engine, pytest.mark.reliability]


# ---------------------------------------------------------------- transport (item 2)


@pytest.mark.timeout(240, func_only=True)
def test_1000_idle_keepalive_connections_and_256_live_streams_within_64_mib(faults):
    url = faults.url
    rss_before = rss(faults)

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
            streams = [asyncio.create_task(stream_chunks(client, url, b)) for b in bodies]
            await until(client, url, lambda m: m["decode_server_requests_in_flight"] >= 256, 120)
            peak = rss(faults)
            # Held past the head timeout: kept-alive idle connections are uvicorn's keep-alive's, not cut.
            hold_until = time.monotonic() + HEAD_TIMEOUT_S + 1
            while time.monotonic() < hold_until:
                peak = max(peak, rss(faults))
                await asyncio.sleep(0.2)
            answered = sum(await asyncio.gather(*(still_answers(r, w) for r, w in idle)))
            peak = max(peak, rss(faults))
            r = await client.post(url + "/abort_requests", json={"request_ids": [b["request_id"] for b in bodies]})
            assert r.status_code == 200
            finishes = [finish_of(c) for c in await asyncio.wait_for(asyncio.gather(*streams), 120)]
        for _, writer in idle:
            writer.close()
        return peak, finishes, answered

    peak, finishes, answered = asyncio.run(run())
    growth = peak - rss_before
    print(f"RSS before {rss_before / MIB:.1f} MiB, peak with 1,000 idle + 256 streams +{growth / MIB:.1f} MiB")
    assert answered == 1000
    assert finishes == ["abort"] * 256
    assert growth < 64 * MIB, growth
    wait_idle(url, 5.0)
    assert rss(faults) - rss_before < 64 * MIB


@pytest.mark.timeout(120, func_only=True)
def test_a_head_sent_byte_by_byte_is_cut_at_the_head_timeout_and_others_run_at_normal_speed(faults):
    url = faults.url
    body = scripted(PROMPT, [9707, 11, 1879, 0, 1], output_mode="text")

    async def normal(client: httpx.AsyncClient) -> float:
        start = time.monotonic()
        chunks = await stream_chunks(client, url, body)
        assert finish_of(chunks) == "stop" and tokens_of(chunks) == [9707, 11, 1879, 0, 1, IM_END]
        return time.monotonic() - start

    async def slow_client(drip: bool) -> tuple[float, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", faults.port)
        start = time.monotonic()
        head = raw_head(GENERATE, 100, "X-Padding: " + "a" * 200)  # 60 s at 4 bytes a second

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
    wait_idle(url, 5.0)


@pytest.mark.timeout(300, func_only=True)
def test_a_stalled_reader_costs_flat_memory_and_is_cut_after_the_send_timeout(faults):
    """3,000 tokens with 20 logprobs each (~6 MB of SSE) to a client that reads nothing.

    The cut needs the server's socket buffers full. Linux sizes a connection's send buffer from its
    segment size: at loopback's (64 KiB) it takes ~3 MB, ~1,500 tokens, minutes for a loaded
    engine; at an Ethernet-sized segment (what a remote client has) ~150 KB, ~80 tokens. The
    cut's timing is checked to the second in process (tests/app/http/test_stall.py)."""
    url = faults.url
    offset = log_offset(faults)
    body = scripted(PROMPT, [], request_id="stalled-reader", output_mode="text", sampling_params={**LONG, "logprobs": 20})
    raw = stream_body(body)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1460)
    sock.connect(("127.0.0.1", faults.port))
    try:
        rss_before = rss(faults)
        sock.sendall(raw_head(GENERATE, len(raw)) + raw)
        peak, start, deadline = rss_before, time.monotonic(), time.monotonic() + 240
        while gauges(url)["decode_server_requests_in_flight"] > 0 or time.monotonic() - start < 1:
            assert time.monotonic() < deadline, "the stalled stream was never cut"
            peak = max(peak, rss(faults))
            time.sleep(0.25)
        cut_after = time.monotonic() - start
        line = access_line(faults, "stalled-reader", offset)
        received = read_to_eof(sock, 30)  # what the kernel buffered for it, then the server's close
    finally:
        sock.close()
    growth = peak - rss_before
    print(f"stalled reader: cut after {cut_after:.1f} s at {line['output_tokens']} tokens, "
          f"{len(received) / MIB:.2f} MiB were in socket buffers, RSS peak +{growth / MIB:.2f} MiB")
    assert line["status"] == "499"
    assert int(line["output_tokens"]) < 3000  # the engine request was aborted, not run to the end
    assert "stream cut: its client read nothing" in log_since(faults, offset)
    assert b"data: [DONE]" not in received
    assert growth < 64 * MIB, growth
    # The server is fine afterwards.
    wait_idle(url, 5.0)

    async def after() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await stream_chunks(client, url, scripted(PROMPT, [9707, 11], output_mode="text"))

    chunks = asyncio.run(after())
    assert finish_of(chunks) == "stop" and tokens_of(chunks) == [9707, 11, IM_END]
    wait_idle(url, 5.0)


@pytest.mark.timeout(120, func_only=True)
def test_connections_dropped_before_their_body_leave_no_error_and_no_state(faults):
    url = faults.url
    offset = log_offset(faults)
    internal_before = status_count(url, "500")
    raw = json.dumps(scripted(PROMPT, [], sampling_params=LONG)).encode()

    async def one(kind: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", faults.port)
        if kind == 1:
            writer.write(b"POST /inference/v1/gen")
        elif kind == 2:
            writer.write(raw_head(GENERATE, len(raw)))
        elif kind >= 3:
            writer.write(raw_head(GENERATE, len(raw)) + raw[: len(raw) // 2])
        await writer.drain()
        await asyncio.sleep(0.05 * (kind % 3))
        if kind == 4:  # reset, not a clean close
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    async def run() -> None:
        await asyncio.gather(*(one(i % 5) for i in range(500)))

    asyncio.run(run())
    time.sleep(1.0)
    wait_idle(url, 5.0)
    log = log_since(faults, offset)
    assert "Traceback" not in log and " ERROR " not in log and "Exception" not in log, log[-3000:]
    assert status_count(url, "500") == internal_before
    r = httpx.post(url + GENERATE, json=scripted(PROMPT, [9707]), timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == [9707, IM_END]
