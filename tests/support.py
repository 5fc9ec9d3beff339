"""Small helpers the tests share: scripted requests, raw SSE reading."""

from __future__ import annotations

import json
from typing import Any

import httpx

GENERATE = "/inference/v1/generate"


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


def abort_while_queued(url: str, body: dict[str, Any], max_num_seqs: int = 16) -> list[dict[str, Any]]:
    """Stream `body` while `max_num_seqs` long requests hold every engine slot, abort it before
    its first token, and return its chunks (the blockers are aborted afterwards)."""
    import asyncio

    blockers = [
        scripted([9707], [], request_id=f"blocker-{i}", sampling_params={"max_tokens": 400, "ignore_eos": True})
        for i in range(max_num_seqs)
    ]

    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=120) as client:

            async def stream(b: dict[str, Any]) -> list[dict[str, Any]]:
                out = []
                async with client.stream("POST", url + GENERATE, json={**b, "stream": True}) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            out.append(json.loads(line[6:]))
                return out

            block_tasks = [asyncio.create_task(stream(b)) for b in blockers]
            await _until(client, url, lambda m: m["vllm:num_requests_running"] >= max_num_seqs)
            queued = asyncio.create_task(stream(body))
            await _until(client, url, lambda m: m["vllm:num_requests_waiting"] >= 1)
            for _ in range(2):  # twice: the second abort of the same id is a no-op
                r = await client.post(url + "/abort_requests", json={"request_ids": [body["request_id"], "nobody"]})
                assert r.status_code == 200
            result = await asyncio.wait_for(queued, 30)
            await client.post(url + "/abort_requests", json={"request_ids": [b["request_id"] for b in blockers]})
            await asyncio.gather(*block_tasks)
            return result

    return asyncio.run(run())


async def tag_response(request: Any, call_next: Any) -> Any:
    """An operator's `--middleware` (function form), for the frontend-flag tests."""
    response = await call_next(request)
    response.headers["x-operator-middleware"] = "seen"
    return response
