"""Small helpers the tests share: scripted requests, raw SSE reading."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable
from typing import Any

import httpx

GENERATE = "/inference/v1/generate"


def sent_together(requests: dict[str, tuple[Callable[[], Any], ...]]) -> dict[str, tuple[concurrent.futures.Future, ...]]:
    """Each name's requests, every request sent at once and answered when this returns, so that a real
    engine steps them together (batch answers to replayed tokens do not depend on what else it runs).
    Each answer is a future: a test that reads its own (`.result()`) gets what its request raised."""
    with concurrent.futures.ThreadPoolExecutor(max(1, sum(map(len, requests.values())))) as pool:
        return {name: tuple(pool.submit(send) for send in sends) for name, sends in requests.items()}


def scripted(token_ids: list[int], script: list[int], **fields: Any) -> dict[str, Any]:
    """A generate body whose output follows `script` (then EOS), via the replay logits processor."""
    sampling = dict(fields.pop("sampling_params", {}))
    extra = dict(sampling.pop("extra_args", {}))
    extra["replay_token_ids"] = script
    sampling["extra_args"] = extra
    return {"token_ids": token_ids, "sampling_params": sampling, **fields}


def post(url: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(url + GENERATE, json=body, timeout=120, **kw)


def sse_events(url: str, body: dict[str, Any], path: str = GENERATE, **kw: Any) -> list[Any]:
    """Every `data:` payload of a stream, JSON-decoded, ending with the literal "[DONE]"."""
    events: list[Any] = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120, **kw) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                payload = line[6:]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def choice_chunks(events: list[Any], index: int = 0) -> list[dict[str, Any]]:
    return [c for e in events if isinstance(e, dict) for c in e.get("choices", []) if c["index"] == index]


def joined_tokens(events: list[Any], index: int = 0) -> list[int]:
    return [t for c in choice_chunks(events, index) for t in (c.get("token_ids") or [])]


def joined_text(events: list[Any], index: int = 0) -> str:
    return "".join(c.get("text", "") for c in choice_chunks(events, index))


def finish_reason(events: list[Any], index: int = 0) -> str | None:
    reasons = [c["finish_reason"] for c in choice_chunks(events, index) if c.get("finish_reason")]
    return reasons[-1] if reasons else None


def same_chunking(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Whether two choice streams split their tokens the same way (engine timing decides this)."""
    return [c.get("token_ids") for c in a] == [c.get("token_ids") for c in b]


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples in a /metrics text whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, value = line.rsplit(" ", 1)
        head, _, rest = series.partition("{")
        found = dict(pair.split("=", 1) for pair in rest.rstrip("}").split(",") if pair)
        if head == name and all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            total += float(value)
    return total


async def _until(client: httpx.AsyncClient, url: str, ready: Any, timeout_s: float = 30.0) -> None:
    import asyncio
    import time

    names = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = (await client.get(url + "/metrics")).text
        values = {n: sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(n + "{") or l.startswith(n + " ")) for n in names}
        if ready(values):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"engine never reached the wanted state: {values}")


async def tag_response(request: Any, call_next: Any) -> Any:
    """An operator's `--middleware` (function form), for the frontend-flag tests."""
    response = await call_next(request)
    response.headers["x-operator-middleware"] = "seen"
    return response


class RecordBodies:
    """An operator's `--middleware` (class form) that reads every body message of every answer."""

    seen: list[bytes] = []

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def recording(message: Any) -> None:
            if message["type"] == "http.response.body":
                RecordBodies.seen.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, recording if scope["type"] == "http" else send)
