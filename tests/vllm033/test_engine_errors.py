"""On vLLM 0.33's modules: what the engine refuses or ends with an error is answered as 0.33's own
server answers it, at every output level, batch and stream: a paused engine's 503 "Generation is
paused…" (0.32's engine queues instead), and error events in 0.33's `create_error_response` form
(0.32 labelled every stream error InternalServerError). The oracle is 0.33's ServingTokens; for a
derender stream, which 0.33's generate refuses, its coupled chat stream over the same outputs."""

from __future__ import annotations

import json

import pytest

from tests.support.differential_corpus import PROMPT, SCRIPT, Case
from tests.support.inprocess import NO_THINKING
from tests.support import scripted
from tests.support.differential import Result, report, send
from tests.support.allowed import classified
from tests.support.pair import Pair
from tests.vllm033.paused_engine import paused

LEVELS = ("tokens", "text", "derender")
SHAPES = [(level, stream) for level in LEVELS for stream in (False, True)]
IDS = [f"{level}-{'stream' if stream else 'batch'}" for level, stream in SHAPES]
PAUSED = {"code": 503, "type": "ServiceUnavailableError", "param": None,
          "message": "Generation is paused. Please retry after it resumes."}
FAILED = {"code": 500, "type": "InternalServerError", "param": None, "message": "Internal server error"}


def _errors(result: Result) -> list[dict]:
    return [e["error"] for e in result.body if isinstance(e, dict) and "error" in e]


def _content(result: Result) -> str:
    return "".join((c.get("delta") or {}).get("content") or "" for e in result.body if isinstance(e, dict)
                   for c in e.get("choices", []))


async def _chat_stream(pair: Pair) -> tuple[Result, list[int]]:
    """0.33's coupled chat streaming SCRIPT, as a Result, and the prompt it rendered."""
    chat = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            **NO_THINKING, "vllm_xargs": {"replay_token_ids": SCRIPT}}
    r = await pair.theirs.client.post("/v1/chat/completions", json=chat)
    events = [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: ")]
    return Result(r.status_code, r.headers.get("content-type"), None, "sse", events, text=r.text), \
        list(pair.theirs.core.seen[-1].prompt_token_ids)


async def _both(pair: Pair, level: str, stream: bool) -> tuple[Case, Result, Result]:
    if level == "derender" and stream:
        theirs, prompt = await _chat_stream(pair)
    else:
        theirs, prompt = None, PROMPT
    context = {"parse_context": NO_THINKING} if level == "derender" else {}
    case = Case(f"{level}-{'stream' if stream else 'batch'}", body=scripted(prompt, SCRIPT, output_mode=level, stream=stream, **context))
    ours = await send(pair.ours.client, "", case)
    return case, ours, theirs or await send(pair.theirs.client, "", case)


def _answered_alike(level: str, stream: bool, case: Case, ours: Result, theirs: Result, error: dict) -> None:
    if level == "derender" and stream:
        # Against coupled chat: the same error, after the same content. Its form is the generate
        # endpoint's (create_error_response); 0.33's chat stream still labels every generation
        # error InternalServerError, whatever its code (docs: derender-stream).
        chats = {**error, "type": "InternalServerError"}
        assert theirs.status == 200 and _errors(theirs) == [chats] and theirs.body[-1] == "[DONE]", theirs.text
        if ours.status != 200:  # refused before its first chunk: the error's own status and body
            assert ours.status == error["code"] and ours.error == error, ours.text
        else:
            assert _errors(ours) == [error] and ours.body[-1] == "[DONE]", ours.text
            assert _content(ours) == _content(theirs), (ours.text, theirs.text)
        return
    items = classified(case, ours, theirs)
    assert all(e is not None for _, e in items), report(case, ours, theirs, items)
    if stream and ours.kind == "json":
        assert [e.id for _, e in items] == ["stream-refused-before-first-chunk"], report(case, ours, theirs, items)
    assert (ours.error if ours.kind == "json" else _errors(ours)[0]) == error, ours.text
    assert (theirs.error if theirs.kind == "json" else _errors(theirs)[0]) == error, theirs.text


@pytest.mark.parametrize(("level", "stream"), SHAPES, ids=IDS)
def test_a_paused_engine_refuses_new_requests_as_vllm_033s_server(pair, level, stream):
    with paused(pair.ours.core), paused(pair.theirs.core):
        case, ours, theirs = pair.run(_both(pair, level, stream))
    _answered_alike(level, stream, case, ours, theirs, PAUSED)
    assert ours.status == 503, ours.text  # a stream too: nothing was sent before the refusal


class _Switch:
    """A `ScriptedCore.fail` match that holds only while on (the core keeps its failures)."""

    def __init__(self) -> None:
        self.on = True

    def __call__(self, external_id: str) -> bool:
        return self.on


@pytest.mark.parametrize("after_tokens", [0, 2], ids=["before-any-token", "after-two-tokens"])
@pytest.mark.parametrize(("level", "stream"), SHAPES, ids=IDS)
def test_an_engine_error_is_answered_as_vllm_033s_server(pair, level, stream, after_tokens):
    switch = _Switch()
    pair.ours.core.fail(switch, after_tokens), pair.theirs.core.fail(switch, after_tokens)
    try:
        case, ours, theirs = pair.run(_both(pair, level, stream))
    finally:
        switch.on = False
    _answered_alike(level, stream, case, ours, theirs, FAILED)
    # A stream that sent tokens reports the error as an event after them.
    assert ours.status == (200 if stream and after_tokens else 500), ours.text
