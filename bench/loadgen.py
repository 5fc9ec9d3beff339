"""Async httpx load generator for the generate/chat endpoints, loopback only.

`run_load()` keeps N requests in flight (a worker per slot), each issuing
requests from `make_stream(worker, seq)` until `requests` have been issued or
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

A stream of kind "rfc" is the RFC's two-hop derender client: it streams
`output_mode="tokens"` from /inference/v1/generate and POSTs each SSE chunk to
vLLM's `/v1/chat/completions/derender` (stream=true) with the `stream_state`
returned by the previous call, one call at a time, in order. Its events are
timestamped when each derender response arrives (that is when the client has
the parsed delta); the generate chunks are read concurrently into a queue so
the generate stream is never throttled by the derender calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec

from bench.stats import summarize_load

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
DERENDER_CHAT_PATH = "/v1/chat/completions/derender"

_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()
_JSON = {"content-type": "application/json"}


def require_loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"loadgen only talks to loopback servers, got {url!r}")


@dataclass
class Stream:
    """One streamed request to issue.

    kind "sse": POST `body` to `path`, read the SSE response.
    kind "batch": POST `body` (stream false) to `path`, read one JSON response.
    kind "rfc": as "sse" on /inference/v1/generate (tokens), plus one POST per chunk to
    `derender_path` (on `derender_url`, default the same server) with `derender_ctx`
    (model, prompt_token_ids, prompt_tokens, chat_request).
    """

    label: str
    path: str
    body: dict[str, Any]
    kind: str = "sse"
    derender_path: str = DERENDER_CHAT_PATH
    derender_ctx: dict[str, Any] | None = None
    derender_url: str | None = None  # base URL of the derender server (default: the generate server)


@dataclass
class StreamResult:
    label: str
    start: float
    end: float | None = None  # stream fully read; None if it failed or was cut off
    times: list[float] = field(default_factory=list)  # absolute time of each token-carrying event
    ntoks: list[int] = field(default_factory=list)  # tokens in that event
    events: int = 0  # all data events (incl. role-only, usage, finish-only)
    extra_calls: int = 0  # rfc: derender POSTs made
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


async def _read_generate(client: httpx.AsyncClient, spec: Stream, res: StreamResult, queue: asyncio.Queue) -> None:
    """rfc: read the generate stream into `queue` (None at the end), never waiting on derender."""
    try:
        async with client.stream("POST", spec.path, content=_enc.encode(spec.body), headers=_JSON) as r:
            res.status = r.status_code
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return
            async for _now, payload in _sse_payloads(r):
                if payload is None:
                    break
                queue.put_nowait(payload)
    finally:
        queue.put_nowait(None)


async def _derender_chunks(client: httpx.AsyncClient, spec: Stream, res: StreamResult, queue: asyncio.Queue, target: str) -> None:
    """rfc: one /derender POST per generate chunk, in order, each with the previous stream_state."""
    ctx = spec.derender_ctx or {}
    state = None
    while True:
        payload = await queue.get()
        if payload is None:
            return
        chunk = _dec.decode(payload)
        if "error" in chunk and not chunk.get("choices"):
            res.error = f"error event: {str(chunk['error'])[:300]}"
            return
        body = {"stream": True, **ctx, "generate_chunk": chunk, "stream_state": state}
        r = await client.post(target, content=_enc.encode(body), headers=_JSON)
        now = time.perf_counter()
        res.extra_calls += 1
        if r.status_code != 200:
            res.error = f"derender HTTP {r.status_code}: {r.content[:300]!r}"
            return
        out = _dec.decode(r.content)
        state = out["stream_state"]
        res.events += 1
        n, _ = event_tokens(chunk)
        _, finish = event_tokens(out["chunk"])
        if n:
            res.times.append(now)
            res.ntoks.append(n)
        if finish:
            res.finish_reason = finish


async def _run_rfc(client: httpx.AsyncClient, spec: Stream, res: StreamResult) -> None:
    target = spec.derender_path
    if spec.derender_url:
        require_loopback(spec.derender_url)
        target = spec.derender_url.rstrip("/") + spec.derender_path
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    reader = asyncio.ensure_future(_read_generate(client, spec, res, queue))
    try:
        await _derender_chunks(client, spec, res, queue, target)
        if res.error is None:
            await reader  # the generate stream's own errors land in res.error
        if res.error is None:
            res.end = time.perf_counter()
    finally:
        if not reader.done():
            reader.cancel()
            try:
                await reader
            except BaseException:
                pass


async def run_one(client: httpx.AsyncClient, spec: Stream, res: StreamResult | None = None) -> StreamResult:
    """Issue one stream; fills (and returns) `res`, whose start is now."""
    if res is None:
        res = StreamResult(label=spec.label, start=time.perf_counter())
    res.start = time.perf_counter()
    try:
        if spec.kind == "rfc":
            await _run_rfc(client, spec, res)
        elif spec.kind == "batch":
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
    make_stream: Callable[[int, int], Stream],
    *,
    concurrency: int,
    requests: int,
    time_limit_s: float,
) -> LoadResult:
    """Keep `concurrency` streams in flight until `requests` were issued or time runs out."""
    require_loopback(base_url)
    results: list[StreamResult] = []
    issued = 0
    limits = httpx.Limits(max_connections=2 * concurrency + 8, max_keepalive_connections=2 * concurrency + 8)
    timeout = httpx.Timeout(connect=30.0, read=max(60.0, time_limit_s), write=30.0, pool=max(60.0, time_limit_s))
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout, trust_env=False) as client:

        async def worker(w: int) -> None:
            nonlocal issued
            while issued < requests:
                seq = issued
                issued += 1
                spec = make_stream(w, seq)
                res = StreamResult(label=spec.label, start=time.perf_counter())
                results.append(res)
                await run_one(client, spec, res)

        started = time.perf_counter()
        tasks = [asyncio.ensure_future(worker(w)) for w in range(concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=time_limit_s)
        truncated = bool(pending)
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        finished = time.perf_counter()
    return LoadResult(results, started, finished, truncated, concurrency, requests)


# ------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Send one request body N-concurrently (streamed, or --batch) and print the summary JSON.")
    p.add_argument("url", help="base URL, loopback only (e.g. http://127.0.0.1:8000)")
    p.add_argument("--path", default="/inference/v1/generate")
    p.add_argument("--body", required=True, help="JSON file with the request body (stream is forced on, or off with --batch)")
    p.add_argument("--batch", action="store_true", help="non-streaming requests (stream: false), one JSON response each")
    p.add_argument("--concurrency", "-c", type=int, default=1)
    p.add_argument("--requests", "-n", type=int, default=None, help="default: = concurrency")
    p.add_argument("--time-limit", type=float, default=120.0)
    a = p.parse_args(argv)
    with open(a.body) as f:
        body = {**json.load(f), "stream": not a.batch}
    spec = Stream("request", a.path, body, kind="batch" if a.batch else "sse")
    load = asyncio.run(
        run_load(a.url, lambda w, i: spec, concurrency=a.concurrency, requests=a.requests or a.concurrency, time_limit_s=a.time_limit)
    )
    json.dump(summarize_load(load), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
