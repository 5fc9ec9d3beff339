"""The differential harness: a corpus case (tests/support/differential_corpus.py) sent to ours and to
vLLM's own server, the two answers compared, each divergence described for the allowed lists
(tests/support/allowed.py) to name; tests/app/vllm/test_differential.py runs it on each vLLM line.

Compared: the status; `Content-Type` and `X-Request-Id` response headers; error bodies (shape,
`type`, `code`; the message only where a case names a substring both must contain); batch bodies
field by field, key order included (ids and `created` normalised); stream `data:` payloads in
order, chunk by chunk where both servers split the tokens the same way, else the per-choice
concatenation, plus any non-`data:` SSE lines.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support import GENERATE, choice_chunks, same_chunking
from tests.support.differential_corpus import Case

DOC = Path(__file__).resolve().parents[2] / "docs" / "vllm-differences.md"
CONCURRENCY = 6  # per server; both servers are driven at once
FLOAT_TOLERANCE = 1e-4  # logprobs: the two engines batch requests differently

# ---------------------------------------------------------------- results


@dataclass
class Result:
    status: int
    content_type: str | None
    x_request_id: str | None
    kind: str  # "json" (a parsed body), "sse" (the data: payloads) or "text" (neither)
    body: Any = None  # the parsed JSON body, or the list of SSE payloads ("[DONE]" kept literally)
    other_lines: list[str] = field(default_factory=list)  # non-blank SSE lines that are not data:
    text: str = ""  # the raw body, cut, for reports
    seconds: float = 0.0

    @property
    def error(self) -> dict[str, Any] | None:
        if self.kind == "json" and isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            return self.body["error"]
        return None

    @property
    def message(self) -> str:
        return str((self.error or {}).get("message", ""))

    def summary(self) -> str:
        if self.kind == "sse":
            return f"{self.status} SSE, {len(self.body)} events"
        return f"{self.status} {_cut(self.text, 300)}"


async def send(client: httpx.AsyncClient, url: str, case: Case) -> Result:
    started = time.monotonic()
    async with client.stream("POST", url + GENERATE, content=case.encoded(), headers=case.request_headers()) as r:
        content_type = r.headers.get("content-type")
        x_request_id = r.headers.get("x-request-id")
        if (content_type or "").startswith("text/event-stream"):
            events: list[Any] = []
            other: list[str] = []
            raw: list[str] = []
            async for line in r.aiter_lines():
                raw.append(line)
                if line.startswith("data: "):
                    payload = line[6:]
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
                elif line.strip():
                    other.append(line)
            return Result(r.status_code, content_type, x_request_id, "sse", events, other,
                          _cut("\n".join(raw), 2000), time.monotonic() - started)
        text = (await r.aread()).decode(errors="replace")
    try:
        return Result(r.status_code, content_type, x_request_id, "json", json.loads(text), text=text,
                      seconds=time.monotonic() - started)
    except ValueError:
        return Result(r.status_code, content_type, x_request_id, "text", text=text, seconds=time.monotonic() - started)


async def run_corpus(ours_url: str, vllm_url: str, cases: list[Case]) -> dict[str, tuple[Result, Result]]:
    limits = httpx.Limits(max_connections=CONCURRENCY * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        gates = {ours_url: asyncio.Semaphore(CONCURRENCY), vllm_url: asyncio.Semaphore(CONCURRENCY)}

        async def one(url: str, case: Case) -> Result:
            async with gates[url]:
                return await send(client, url, case)

        async def both(case: Case) -> tuple[str, tuple[Result, Result]]:
            ours, theirs = await asyncio.gather(one(ours_url, case), one(vllm_url, case))
            return case.id, (ours, theirs)

        # Logprobs of the demo model's near-flat distribution move in the 6th digit with the
        # batch a request shares (CPU kernels block by batch size), enough to swap near-tied
        # top-k entries; so those cases run one at a time, alone in each engine.
        alone = [c for c in cases if _wants_logprobs(c)]
        results = dict(await asyncio.gather(*(both(c) for c in cases if c not in alone)))
        for case in alone:
            case_id, pair = await both(case)
            results[case_id] = pair
        return results


def _wants_logprobs(case: Case) -> bool:
    sp = case.body.get("sampling_params") if isinstance(case.body, dict) else None
    return isinstance(sp, dict) and any(sp.get(k) is not None for k in ("logprobs", "prompt_logprobs"))


# ---------------------------------------------------------------- comparison

MISSING = "<absent>"


@dataclass(frozen=True)
class Divergence:
    where: str  # "status", "header:content-type", "error.type", "request_id", "$.choices[0].token_ids", ...
    ours: Any
    theirs: Any

    def line(self) -> str:
        return f"{self.where}: ours={_cut(_show(self.ours), 160)} vLLM={_cut(_show(self.theirs), 160)}"


def _show(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n] + f"…(+{len(s) - n})"


def _same_scalar(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return type(a) is type(b) and a == b
    if type(a) is not type(b):  # 1 vs 1.0: a different JSON text
        return False
    return a == b or math.isclose(a, b, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE)


def deep_diff(a: Any, b: Any, path: str, out: list[Divergence]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in [*a, *(k for k in b if k not in a)]:
            if k not in b or k not in a:
                out.append(Divergence(f"{path}.{k}", a.get(k, MISSING), b.get(k, MISSING)))
            else:
                deep_diff(a[k], b[k], f"{path}.{k}", out)
        if set(a) == set(b) and list(a) != list(b):
            out.append(Divergence(f"{path}{{key order}}", list(a), list(b)))
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            deep_diff(x, y, f"{path}[{i}]", out)
        if len(a) != len(b):
            out.append(Divergence(f"{path}.length", len(a), len(b)))
    elif not _same_scalar(a, b):
        out.append(Divergence(path, a, b))


def _skeleton(v: Any) -> Any:
    """Field names and JSON types only: for cases whose output tokens are not scripted."""
    if isinstance(v, dict):
        return {k: _skeleton(x) for k, x in v.items() if k not in ("token_ids", "logprobs")}
    if isinstance(v, list):
        return [_skeleton(v[0])] if v else []
    return type(v).__name__


def _deterministic_id(case: Case) -> bool:
    """Whether the request names itself (header or body): then both answers carry a known id."""
    if any(k.lower() == "x-request-id" for k in case.headers):
        return True
    return isinstance(case.body, dict) and isinstance(case.body.get("request_id"), str)


_RANDOM_HEX = re.compile(r"[0-9a-f]{16,32}")


def _norm_id(case: Case, rid: Any) -> Any:
    if isinstance(rid, str) and not _deterministic_id(case):
        return _RANDOM_HEX.sub("<random>", rid)
    return rid


def _compare_error(case: Case, a: Result, b: Result, out: list[Divergence]) -> None:
    if a.error is None or b.error is None:
        out.append(Divergence("error.body", _cut(a.text, 200), _cut(b.text, 200)))
        return
    if sorted(a.body) != sorted(b.body):
        out.append(Divergence("error.shape", sorted(a.body), sorted(b.body)))
    if sorted(a.error) != sorted(b.error):
        out.append(Divergence("error.fields", sorted(a.error), sorted(b.error)))
    for key in ("type", "code"):
        if a.error.get(key) != b.error.get(key):
            out.append(Divergence(f"error.{key}", a.error.get(key), b.error.get(key)))
    if case.message is not None and (case.message not in a.message or case.message not in b.message):
        out.append(Divergence("error.message", a.message, b.message))


def _compare_batch(case: Case, a: Result, b: Result, out: list[Divergence]) -> None:
    ours, theirs = dict(a.body), dict(b.body)
    rid_a, rid_b = _norm_id(case, ours.get("request_id", MISSING)), _norm_id(case, theirs.get("request_id", MISSING))
    if rid_a != rid_b:
        out.append(Divergence("request_id", rid_a, rid_b))
    created_a, created_b = ours.get("created", MISSING), theirs.get("created", MISSING)
    if type(created_a) is not type(created_b) or (isinstance(created_a, int) and abs(created_a - created_b) > 120):
        out.append(Divergence("$.created", created_a, created_b))
    # Checked above; masked (not dropped) so the key order is still compared.
    for body in (ours, theirs):
        for key in ("request_id", "created"):
            if key in body:
                body[key] = "<checked>"
    if case.compare == "shape":
        deep_diff(_skeleton(ours), _skeleton(theirs), "$", out)
    else:
        deep_diff(ours, theirs, "$", out)


def _indexes(chunks: list[dict[str, Any]]) -> list[list[int]]:
    return [[c.get("index") for c in chunk.get("choices") or []] for chunk in chunks]


def _joined(chunks: list[dict[str, Any]], key: str) -> Any:
    if key == "logprobs":
        return [e for c in chunks for e in ((c.get("logprobs") or {}).get("content") or [])]
    if key == "text":
        return "".join(c.get("text") or "" for c in chunks) if any("text" in c for c in chunks) else MISSING
    return [t for c in chunks for t in (c.get(key) or [])]


def _choice_count(chunks: list[dict[str, Any]]) -> int:
    return 1 + max([i for chunk in _indexes(chunks) for i in chunk if isinstance(i, int)], default=0)


def chunked_alike(a: Result, b: Result) -> bool:
    """Both engines split every choice's tokens the same way, in the same chunk order."""
    ca = [e for e in a.body if isinstance(e, dict)]
    cb = [e for e in b.body if isinstance(e, dict)]
    n = _choice_count(ca + cb)
    return _indexes(ca) == _indexes(cb) and all(
        same_chunking(choice_chunks(a.body, i), choice_chunks(b.body, i)) for i in range(n))


def _compare_stream(case: Case, a: Result, b: Result, out: list[Divergence]) -> None:
    if a.other_lines != b.other_lines:
        out.append(Divergence("sse.other-lines", a.other_lines[:3], b.other_lines[:3]))
    for r in (a, b):
        if not r.body or r.body[-1] != "[DONE]":
            out.append(Divergence("sse.done", a.body[-1:] if a.body else [], b.body[-1:] if b.body else []))
            break
    ca = [e for e in a.body if isinstance(e, dict)]
    cb = [e for e in b.body if isinstance(e, dict)]
    ids_a = {_norm_id(case, c.get("request_id", MISSING)) for c in ca}
    ids_b = {_norm_id(case, c.get("request_id", MISSING)) for c in cb}
    if len(ids_a) > 1 or len(ids_b) > 1:
        out.append(Divergence("sse.request_id-varies", sorted(map(str, ids_a)), sorted(map(str, ids_b))))
    if ids_a != ids_b:
        out.append(Divergence("request_id", min(map(str, ids_a), default=MISSING), min(map(str, ids_b), default=MISSING)))
    strip = lambda chunks: [{k: "<checked>" if k == "request_id" else v for k, v in c.items()} for c in chunks]  # noqa: E731
    ca, cb = strip(ca), strip(cb)
    if case.compare == "shape":
        deep_diff(_skeleton(ca[:1] + ca[-1:]), _skeleton(cb[:1] + cb[-1:]), "sse", out)
        return
    n = _choice_count(ca + cb)
    events_a, events_b = a.body, b.body
    if chunked_alike(a, b):
        deep_diff(ca, cb, "sse", out)  # chunk by chunk
        return
    # Different engine chunking: compare what each choice adds up to, and the chunks without choices.
    for i in range(n):
        xa, xb = choice_chunks(events_a, i), choice_chunks(events_b, i)
        for key in ("token_ids", "text", "logprobs"):
            deep_diff(_joined(xa, key), _joined(xb, key), f"sse.choice[{i}].joined.{key}", out)
        for key in ("finish_reason", "stop_reason"):
            last_a = xa[-1].get(key, MISSING) if xa else MISSING
            last_b = xb[-1].get(key, MISSING) if xb else MISSING
            deep_diff(last_a, last_b, f"sse.choice[{i}].last.{key}", out)
        deep_diff(sorted({k for c in xa for k in c}), sorted({k for c in xb for k in c}), f"sse.choice[{i}].fields", out)
    deep_diff([c for c in ca if not c.get("choices")], [c for c in cb if not c.get("choices")], "sse.no-choice-chunks", out)
    deep_diff(ca[0].get("prompt_token_ids", MISSING) if ca else MISSING,
              cb[0].get("prompt_token_ids", MISSING) if cb else MISSING, "sse[0].prompt_token_ids", out)
    deep_diff([sorted(k for k in c if k != "choices") for c in ca[:1]], [sorted(k for k in c if k != "choices") for c in cb[:1]],
              "sse[0].fields", out)


def compare(case: Case, a: Result, b: Result) -> list[Divergence]:
    out: list[Divergence] = []
    if a.status != b.status:
        return [Divergence("status", a.status, b.status)]
    if (a.content_type or "").lower() != (b.content_type or "").lower():
        out.append(Divergence("header:content-type", a.content_type or MISSING, b.content_type or MISSING))
    if a.x_request_id != b.x_request_id:
        out.append(Divergence("header:x-request-id", a.x_request_id or MISSING, b.x_request_id or MISSING))
    if a.kind != b.kind:
        out.append(Divergence("body.kind", a.kind, b.kind))
    elif not 200 <= a.status < 300:
        _compare_error(case, a, b, out)
    elif a.kind == "sse":
        _compare_stream(case, a, b, out)
    elif a.kind == "json":
        _compare_batch(case, a, b, out)
    elif a.text != b.text:
        out.append(Divergence("body.text", _cut(a.text, 200), _cut(b.text, 200)))
    return out


# ---------------------------------------------------------------- the lists' entries (tests/support/allowed.py)


@dataclass(frozen=True)
class Entry:
    id: str  # ALLOWED: a heading id in docs/vllm-differences.md
    summary: str
    match: Callable[[Case, frozenset[str], Divergence, Result, Result], bool]


def status(ours: int, theirs: int) -> Callable[[Divergence], bool]:
    return lambda d: d.where == "status" and d.ours == ours and d.theirs == theirs


def report(case: Case, a: Result, b: Result, items: list[tuple[Divergence, Entry | None]]) -> str:
    lines = [f"case {case.id}: ours {a.summary()} | vLLM {b.summary()}"]
    lines.append(f"  request: {_cut(case.encoded().decode(errors='replace'), 400)} headers={case.request_headers()}")
    for d, e in items[:12]:
        lines.append(f"  {'[' + e.id + '] ' if e else 'UNEXPLAINED '}{d.line()}")
    if len(items) > 12:
        lines.append(f"  … {len(items) - 12} more")
    return "\n".join(lines)
