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
