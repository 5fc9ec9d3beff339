"""What the fault tests (test_faults_*.py) share: the package server warmed up, the gauges and
access-log lines they read, raw HTTP pieces for sockets, and stream helpers."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from typing import Any

import httpx
import psutil

from tests.support import servers
from tests.support import GENERATE, scripted

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


def parse_metrics(text: str) -> dict[str, float]:
    def total(name: str) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((name + " ", name + "{"))
        )

    return {name: total(name) for name in GAUGES}


def gauges(url: str) -> dict[str, float]:
    return parse_metrics(httpx.get(url + "/metrics", timeout=60).text)


async def agauges(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    return parse_metrics((await client.get(url + "/metrics")).text)


def status_count(url: str, status: str) -> float:
    text = httpx.get(url + "/metrics", timeout=60).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("decode_server_requests_total{") and f'status="{status}"' in line
    )


def wait_idle(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        values = gauges(url)
        if not any(values.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle after {seconds}s: {values}")
        time.sleep(0.05)


async def until(client: httpx.AsyncClient, url: str, ready: Any, seconds: float = 30.0) -> float:
    """Poll the gauges until `ready(values)`; return how long it took."""
    start = time.monotonic()
    while True:
        values = await agauges(client, url)
        if ready(values):
            return time.monotonic() - start
        if time.monotonic() - start > seconds:
            raise AssertionError(f"the server never reached the wanted state: {values}")
        await asyncio.sleep(0.02)


def rss(server: servers.Server) -> int:
    return psutil.Process(server.proc.pid).memory_info().rss


def log_offset(server: servers.Server) -> int:
    return server.log_path.stat().st_size


def log_since(server: servers.Server, offset: int) -> str:
    with open(server.log_path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def access_line(server: servers.Server, request_id: str, offset: int = 0, seconds: float = 10.0) -> dict[str, str]:
    pattern = re.compile(rf"decode_server\.access: request_id={re.escape(request_id)} (.*)")
    deadline = time.monotonic() + seconds
    while True:
        for line in log_since(server, offset).splitlines():
            if m := pattern.search(line):
                return dict(kv.split("=", 1) for kv in m.group(1).split())
        if time.monotonic() > deadline:
            raise AssertionError(f"no access line for {request_id}")
        time.sleep(0.1)


def stream_body(body: dict[str, Any]) -> bytes:
    return json.dumps({**body, "stream": True}).encode()


def raw_head(path: str, length: int, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: faults", "Content-Type: application/json", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_to_eof(sock: socket.socket, seconds: float) -> bytes:
    sock.settimeout(seconds)
    data = bytearray()
    try:
        while chunk := sock.recv(1 << 20):
            data += chunk
    except ConnectionResetError:
        pass
    return bytes(data)


def warm_up(server: servers.Server) -> None:
    """One request of each mode first, so lazy imports and first-use caches are not counted as growth."""
    for mode in ("tokens", "text", "derender"):
        body = scripted(PROMPT, [9707, 11, 1879], output_mode=mode)
        if mode == "derender":
            body["parse_context"] = {"chat_template_kwargs": {"enable_thinking": False}}
        for stream in (False, True):
            r = httpx.post(server.url + GENERATE, json={**body, "stream": stream}, timeout=300)
            assert r.status_code == 200, r.text


async def stream_chunks(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    async with client.stream("POST", url + GENERATE, json={**body, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def finish_of(chunks: list[dict[str, Any]]) -> str | None:
    reasons = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c.get("finish_reason")]
    return reasons[-1] if reasons else None


def tokens_of(chunks: list[dict[str, Any]]) -> list[int]:
    return [t for chunk in chunks for c in chunk["choices"] for t in c.get("token_ids") or []]
