"""One parser configuration, two servers, the same scripted engine outputs: ours and vLLM's chat.

`Pair` opens vLLM's own API server and ours in process (tests/support/inprocess.py) with the same model
directory and parser flags. For a chat request and a token script, `Pair.compare` gets the
generate request a render server would send us from vLLM's own /v1/chat/completions/render, runs
our derender level on it (batch and stream) and vLLM's coupled /v1/chat/completions on the same
script (batch and stream), and returns both sides' answers in comparable form.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from tests.support import chat_cases as cc
from tests.support.inprocess import InProcess, serve, vllm_serve
from tests.support import GENERATE

CHAT = "/v1/chat/completions"


def id_shape(tool_call_id: str | None) -> str | None:
    """A tool-call id with its random part blanked: both sides must use the same id scheme."""
    if tool_call_id is None:
        return None
    shape = re.sub(r"[0-9a-f]{16,}", "<hex>", tool_call_id)
    return "<alnum9>" if re.fullmatch(r"[A-Za-z0-9]{9}", shape) else shape


def _shaped(delta_or_message: dict[str, Any]) -> dict[str, Any]:
    calls = delta_or_message.get("tool_calls")
    if not calls:
        return delta_or_message
    return {**delta_or_message, "tool_calls": [{**tc, "id": id_shape(tc.get("id"))} if "id" in tc else tc for tc in calls]}


@dataclass
class Side:
    """One server's answer to one case: per choice index, the batch message and the stream."""

    batch: dict[int, tuple[dict[str, Any], str | None]]  # index -> (message, finish_reason)
    stream: dict[int, list[tuple[dict[str, Any], str | None]]]  # index -> [(delta, finish_reason)], empty deltas dropped
    # The error answer instead of the batch body, and the stream's error event (vLLM's parser raised).
    batch_error: dict[str, Any] | None = None
    stream_error: dict[str, Any] | None = None

    def folded(self, index: int) -> dict[str, Any]:
        return cc.accumulate([d for d, _ in self.stream[index]])

    def batch_folded(self, index: int) -> dict[str, Any]:
        return cc.batch_message(self.batch[index][0])

    def batch_finish(self, index: int) -> str | None:
        return self.batch[index][1]

    def stream_finish(self, index: int) -> str | None:
        reasons = [f for _, f in self.stream[index] if f]
        return reasons[-1] if reasons else None


def _stream_error(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    errors = [event["error"] for event in events if "error" in event]
    assert len(errors) <= 1, errors
    return errors[0] if errors else None


def _stream_side(events: list[dict[str, Any]]) -> dict[int, list[tuple[dict[str, Any], str | None]]]:
    out: dict[int, list[tuple[dict[str, Any], str | None]]] = {}
    for event in events:
        for choice in event.get("choices", []):
            # Ours also sends `{}` for a step the parser held back (the generate wire always
            # carries token_ids); what is said, and in what order, must be coupled chat's.
            if choice["delta"] or choice.get("finish_reason"):
                out.setdefault(choice["index"], []).append((_shaped(choice["delta"]), choice.get("finish_reason")))
    return out


def _batch_side(body: dict[str, Any]) -> dict[int, tuple[dict[str, Any], str | None]]:
    return {c["index"]: (_shaped(c["message"]), c["finish_reason"]) for c in body["choices"]}


async def _sse(app: InProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    async with app.client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, (path, await r.aread())
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


async def _post(app: InProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await app.client.post(path, json={**body, "stream": False})
    assert r.status_code == 200, (path, r.text)
    return r.json()


async def _side(app: InProcess, path: str, body: dict[str, Any]) -> Side:
    """Batch and stream answers; an error answer (vLLM's parser raised) is kept, not asserted away."""
    r = await app.client.post(path, json={**body, "stream": False})
    error = r.json()["error"] if r.status_code != 200 else None
    assert error is None or error["code"] == r.status_code, (path, r.text)
    events = await _sse(app, path, body)
    return Side({} if error else _batch_side(r.json()), _stream_side(events), error, _stream_error(events))


@dataclass
class Pair:
    ours: InProcess
    vllm: InProcess
    renders: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def tokenizer(self) -> Any:
        return self.vllm.llm.tokenizer

    async def derender_request(self, chat: dict[str, Any], script: list[int]) -> dict[str, Any]:
        """What a render server sends us for `chat`: vLLM's render of it plus parse_context (rendered
        once per chat: the matrix's chunkings reuse the parity check's render)."""
        gen = await self._render(chat)
        sampling = dict(gen["sampling_params"])
        sampling["extra_args"] = {**(sampling.get("extra_args") or {}), "replay_token_ids": script}
        return {
            "token_ids": gen["token_ids"],
            "sampling_params": sampling,
            "output_mode": "derender",
            "parse_context": cc.parse_context(chat),
            **{k: gen[k] for k in ("reasoning_ended", "reasoning_parser_kwargs") if gen.get(k) is not None},
        }

    async def rendered_sampling(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The sampling params vLLM's render gives `chat` (what its parser's adjust_request set)."""
        return (await self._render(chat))["sampling_params"]

    async def _render(self, chat: dict[str, Any]) -> dict[str, Any]:
        key = json.dumps(chat, sort_keys=True)
        if key not in self.renders:
            rendered = await _post(self.vllm, CHAT + "/render", chat)
            self.renders[key] = rendered[0] if isinstance(rendered, list) else rendered
        return self.renders[key]

    async def ours_streamed(self, request: dict[str, Any]) -> Side:
        """Our stream alone for a generate request (its batch left empty): a client's own
        `stream_interval` or stop strings on what `derender_request` gave."""
        events = await _sse(self.ours, GENERATE, request)
        return Side({}, _stream_side(events), stream_error=_stream_error(events))

    async def render_error(self, chat: dict[str, Any]) -> tuple[int, str]:
        """(status, message) of vLLM's render refusing `chat`."""
        r = await self.vllm.client.post(CHAT + "/render", json=cc.chat_body(**chat))
        return r.status_code, r.json()["error"]["message"] if r.status_code != 200 else r.text

    async def compare(self, chat: dict[str, Any], script: list[int]) -> tuple[Side, Side]:
        """(ours, vLLM's) for one chat request whose model output is `script` (then EOS)."""
        chat = cc.chat_body(**chat)
        request = await self.derender_request(chat, script)
        coupled = {**chat, "vllm_xargs": {"replay_token_ids": script}}
        ours, theirs = await _side(self.ours, GENERATE, request), await _side(self.vllm, CHAT, coupled)
        prompts = {tuple(s.prompt_token_ids) for s in self.vllm.core.seen[-2:] + self.ours.core.seen[-2:]}
        assert len(prompts) == 1, "both servers saw the same prompt tokens"
        return ours, theirs


@contextlib.asynccontextmanager
async def pair(model_dir: Path, *flags: str) -> AsyncIterator[Pair]:
    # vLLM's lifespan freezes the heap for a long-lived server (a full gc.collect, ~1.5 s here);
    # the matrix opens dozens of short-lived servers in one test process, where it buys nothing.
    with mock.patch("vllm.entrypoints.launchers.utils.server_utils.freeze_gc_heap", lambda: None):
        async with vllm_serve(model_dir, *flags) as theirs, serve(model_dir, *flags) as ours:
            # Streams are compared chunk by chunk: a step must not go out before each stream took
            # the previous one, however long a loaded machine leaves its reader unscheduled (with
            # a wall-clock bound the collector merges the two steps into one chunk, on one side
            # only). Every reader here reads to its end, so the wait ends.
            for side in (ours, theirs):
                side.core.lockstep_timeout_s = None
            yield Pair(ours, theirs)
