"""Async httpx load generator for the generate/chat endpoints, loopback only.

`run_load()` keeps N requests in flight (a worker per slot), each issuing
requests from `make_stream(seq)` until `requests` have been issued or
`time_limit_s` runs out (then in-flight requests are cancelled and the run is
marked truncated). Every SSE `data:` event is timestamped on arrival
(`time.perf_counter()` when the bytes were read) together with the number of
output tokens it carries; the statistics over those timestamps (TTFT, TPOT, E2E,
tokens/s) are bench.stats.

Tokens per event come from `choices[].token_ids` (generate at every level; the
chat completions stream with `return_token_ids: true`); an event whose choice
has content but no `token_ids` counts as one token.

A request of kind "batch" (`stream: false`) is one POST whose whole JSON response is
one "event" timestamped when it has been read: its TTFT is its E2E.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}

_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()
_JSON = {"content-type": "application/json"}


def arun(coro):
    """Run the load generator on uvloop when available (less client CPU on a shared 2-core box)."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def require_loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"loadgen only talks to loopback servers, got {url!r}")


@dataclass
class Stream:
    """One request to issue: POST `body` to `path`; kind "sse" reads the SSE response, kind
    "batch" (stream false) one JSON response."""

    path: str
    body: dict[str, Any]
    kind: str = "sse"


@dataclass
class StreamResult:
    start: float
    end: float | None = None  # stream fully read; None if it failed or was cut off
    times: list[float] = field(default_factory=list)  # absolute time of each token-carrying event
    ntoks: list[int] = field(default_factory=list)  # tokens in that event
    events: int = 0  # all data events (incl. role-only, usage, finish-only)
    status: int | None = None
    error: str | None = None
    finish_reason: str | None = None

    @property
    def tokens(self) -> int:
        return sum(self.ntoks)

    @property
    def completed(self) -> bool:
        return self.end is not None and self.error is None


@dataclass
class LoadResult:
    results: list[StreamResult]
    started: float
    finished: float
    truncated: bool
    concurrency: int
    requested: int

    @property
    def wall_s(self) -> float:
        return self.finished - self.started


def event_tokens(obj: dict[str, Any]) -> tuple[int, str | None]:
    """(output tokens carried, finish_reason) of one decoded stream event."""
    n = 0
    finish = None
    for c in obj.get("choices") or ():
        ids = c.get("token_ids")
        if ids is not None:
            n += len(ids)
        elif c.get("text") or _delta_has_payload(c.get("delta")):
            n += 1
        if c.get("finish_reason"):
            finish = c["finish_reason"]
    return n, finish


def _delta_has_payload(delta: dict[str, Any] | None) -> bool:
    return bool(delta) and bool(delta.get("content") or delta.get("reasoning") or delta.get("tool_calls"))


async def _sse_payloads(response: httpx.Response):
    """Yield (arrival_time, payload_bytes) for every `data:` line; stops at [DONE]."""
    buf = b""
    async for data in response.aiter_raw():
        now = time.perf_counter()
        buf += data
        while True:
            i = buf.find(b"\n")
            if i < 0:
                break
            line = buf[:i].rstrip(b"\r")
            buf = buf[i + 1 :]
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                yield now, None
                return
            yield now, payload


async def _run_sse(client: httpx.AsyncClient, spec: Stream, res: StreamResult) -> None:
    async with client.stream("POST", spec.path, content=_enc.encode(spec.body), headers=_JSON) as r:
        res.status = r.status_code
        if r.status_code != 200:
            res.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
            return
        async for now, payload in _sse_payloads(r):
            if payload is None:
                break
            obj = _dec.decode(payload)
            res.events += 1
            if "error" in obj and not obj.get("choices"):
                res.error = f"error event: {str(obj['error'])[:300]}"
                return
            n, finish = event_tokens(obj)
            if n:
                res.times.append(now)
                res.ntoks.append(n)
            if finish:
                res.finish_reason = finish
    res.end = time.perf_counter()


async def _run_batch(client: httpx.AsyncClient, spec: Stream, res: StreamResult) -> None:
    """A non-streaming request: the whole response is one event, timestamped when read."""
    r = await client.post(spec.path, content=_enc.encode(spec.body), headers=_JSON)
    now = time.perf_counter()
    res.status = r.status_code
    if r.status_code != 200:
        res.error = f"HTTP {r.status_code}: {r.content[:300]!r}"
        return
    obj = _dec.decode(r.content)
    res.events += 1
    if "error" in obj and not obj.get("choices"):
        res.error = f"error response: {str(obj['error'])[:300]}"
        return
    n, finish = event_tokens(obj)
    if n:
        res.times.append(now)
        res.ntoks.append(n)
    res.finish_reason = finish
    res.end = now


async def run_one(client: httpx.AsyncClient, spec: Stream, res: StreamResult | None = None) -> StreamResult:
    """Issue one stream; fills (and returns) `res`, whose start is now."""
    res = res or StreamResult(start=0.0)
    res.start = time.perf_counter()
    try:
        if spec.kind == "batch":
            await _run_batch(client, spec, res)
        else:
            await _run_sse(client, spec, res)
    except asyncio.CancelledError:
        res.error = res.error or "cancelled (time limit)"
        raise
    except Exception as e:  # a failed request is a data point, not a crash
        res.error = f"{type(e).__name__}: {e}"[:300]
    return res


async def run_load(
    base_url: str,
    make_stream: Callable[[int], Stream],
    *,
    concurrency: int,
    requests: int,
    time_limit_s: float,
) -> LoadResult:
    """Keep `concurrency` streams in flight until `requests` were issued or time runs out."""
    require_loopback(base_url)
    limits = httpx.Limits(max_connections=2 * concurrency + 8, max_keepalive_connections=2 * concurrency + 8)
    timeout = httpx.Timeout(connect=30.0, read=max(60.0, time_limit_s), write=30.0, pool=max(60.0, time_limit_s))
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout, trust_env=False) as client:
        return await run_load_on(client, make_stream, concurrency=concurrency, requests=requests, time_limit_s=time_limit_s)


async def run_load_on(
    client: httpx.AsyncClient,
    make_stream: Callable[[int], Stream],
    *,
    concurrency: int,
    requests: int,
    time_limit_s: float,
) -> LoadResult:
    """`run_load` over a client of the caller's (bench.frontend_inproc: an app in this process)."""
    return await keep_in_flight(lambda seq, res: run_one(client, make_stream(seq), res), concurrency, requests, time_limit_s)


async def keep_in_flight(
    one: Callable[[int, StreamResult], Awaitable[Any]], concurrency: int, requests: int, time_limit_s: float
) -> LoadResult:
    """`concurrency` workers each run `one(seq, result)` for the next request until `requests` were
    issued or time runs out (then the rest are cancelled and the run is marked truncated)."""
    results: list[StreamResult] = []
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while issued < requests:
            seq = issued
            issued += 1
            res = StreamResult(start=time.perf_counter())
            results.append(res)
            await one(seq, res)

    started = time.perf_counter()
    tasks = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    _, pending = await asyncio.wait(tasks, timeout=time_limit_s)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return LoadResult(results, started, time.perf_counter(), bool(pending), concurrency, requests)
