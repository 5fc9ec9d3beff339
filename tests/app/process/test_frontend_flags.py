"""`vllm serve` frontend flags doing what they do on vLLM (issue #13), in process: the real app (its CLI
parse, server config and middleware stack) over the scripted engine.

The real-engine check of each flag is in test_operations.py (one server with all of them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import time

import httpx
import pytest
from starlette.routing import Route

from tests.support.inprocess import PROMPT, body_for, error_of, serve
from tests.support.loopback import loopback
from tests.support.servers import PARSER_FLAGS
from tests.support import GENERATE

pytestmark = pytest.mark.anyio

SCRIPT = [9707, 11, 1879, 0]  # "Hello, world!"
ORIGIN = "https://ui.example"
UNAUTHORIZED = "missing or wrong API key (send 'Authorization: Bearer <key>')"
FLAGS = (
    *PARSER_FLAGS,
    "--api-key", "k1",
    "--allowed-origins", f'["{ORIGIN}"]',
    "--middleware", "tests.support.tag_response",
    "--response-role", "narrator",
)
AUTH = {"Authorization": "Bearer k1"}
# What vLLM's AuthenticationMiddleware guards, as served here.
GUARDED = (GENERATE, "/inference/v1/abort_requests", "/abort_requests", "/v1/load_lora_adapter", "/v1/unload_lora_adapter")
PREFILL_BACKLOG = "The engine has reached its prefill token backlog limit. Please try again later or on a different instance."


def body(mode: str = "tokens", **fields):
    return body_for(mode, SCRIPT, **fields)


# ------------------------------------------------------------------ --api-key, on every route


async def test_every_guarded_route_refuses_without_the_key_and_every_other_route_is_open(demo_model, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")  # the adapter routes exist, and are guarded
    async with serve(demo_model, "--api-key", "k1", "--enable-lora") as s:
        routes = {(r.path, method) for r in s.app.routes if isinstance(r, Route) for method in r.methods - {"HEAD"}}
        guarded = {(path, "POST") for path in GUARDED}
        assert guarded <= routes
        for path, method in sorted(guarded):
            for headers in ({}, {"Authorization": "Bearer k2"}, {"Authorization": "k1"}, {"Authorization": "Bearer k1 "}):
                r = await s.client.request(method, path, json={}, headers=headers)
                assert error_of(r) == (401, UNAUTHORIZED, None), (path, headers)
            r = await s.client.request(method, path, json={}, headers=AUTH)
            assert r.status_code != 401, (path, r.text)
        for path, method in sorted(routes - guarded):  # probes, metrics, models, as vLLM leaves them open
            r = await s.client.request(method, path)
            assert r.status_code == 200, (path, r.text)


# ------------------------------------------------------------------ CORS, --middleware, --response-role


async def test_cors_allows_the_configured_origin_only(demo_model):
    async with serve(demo_model, *FLAGS) as s:
        preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
        r = await s.client.options(GENERATE, headers=preflight)  # no key: a preflight passes the key check, as on vLLM
        assert (r.status_code, r.headers["access-control-allow-origin"]) == (200, ORIGIN)
        assert "POST" in r.headers["access-control-allow-methods"]
        r = await s.client.options(GENERATE, headers={**preflight, "Origin": "https://evil.example"})
        assert (r.status_code, r.text) == (400, "Disallowed CORS origin")
        r = await s.client.post(GENERATE, json=body(), headers={**AUTH, "Origin": ORIGIN})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
        r = await s.client.post(GENERATE, json=body(), headers={**AUTH, "Origin": "https://evil.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


async def test_the_operators_middleware_wraps_every_answer_and_the_role_names_derender_messages(demo_model):
    async with serve(demo_model, *FLAGS) as s:
        r = await s.client.post(GENERATE, json=body("derender"), headers=AUTH)
        assert r.status_code == 200 and r.headers["x-operator-middleware"] == "seen"
        message = r.json()["choices"][0]["message"]
        assert (message["role"], message["content"]) == ("narrator", "Hello, world!")
        refused = await s.client.post(GENERATE, json=body())  # outside the key check, as vLLM stacks them
        assert error_of(refused)[0] == 401 and refused.headers["x-operator-middleware"] == "seen"
        async with s.client.stream("POST", GENERATE, json={**body("derender"), "stream": True}, headers=AUTH) as stream:
            assert stream.headers["x-operator-middleware"] == "seen"
            first = [line async for line in stream.aiter_lines() if line.startswith("data: {")][0]
        assert '"delta":{"role":"narrator","content":""}' in first.replace(" ", "")


async def test_an_operators_middleware_reads_every_event_of_a_stream_and_without_one_cors_still_marks_it(demo_model):
    from tests.support import RecordBodies

    RecordBodies.seen.clear()
    stream_body = {**body("text", request_id="recorded"), "stream": True}
    async with serve(demo_model, "--middleware", "tests.support.RecordBodies") as s:
        async with s.client.stream("POST", GENERATE, json=stream_body) as r:
            raw = b"".join([chunk async for chunk in r.aiter_raw()])
    assert raw.endswith(b"data: [DONE]\n\n") and raw.count(b"data: {") == len(SCRIPT) + 1
    assert b"".join(RecordBodies.seen) == raw, "the operator's middleware saw each event the client got"
    # Without an operator's middleware a stream's events skip Starlette's per-send wrappers
    # (http/sse.py: BODY_SEND); CORS still marks the response's start.
    async with serve(demo_model, "--allowed-origins", f'["{ORIGIN}"]') as s:
        async with s.client.stream("POST", GENERATE, json=stream_body, headers={"Origin": ORIGIN}) as r:
            assert r.headers["access-control-allow-origin"] == ORIGIN
            unwrapped = b"".join([chunk async for chunk in r.aiter_raw()])
    assert _without_created(unwrapped) == _without_created(raw)


def _without_created(sse: bytes) -> bytes:
    return re.sub(rb'"created":\d+', b"", sse)


# ------------------------------------------------------------------ usage and logprob forms


async def test_prompt_token_details_report_the_engines_cached_tokens(demo_model):
    async with serve(demo_model, "--enable-prompt-tokens-details") as s:
        s.core.cached_tokens = lambda request: 1
        usage = (await s.client.post(GENERATE, json=body())).json()["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 1}
        events = await s.events(body("text", stream_options={"include_usage": True}))
        assert events[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 1}
    async with serve(demo_model) as s:
        s.core.cached_tokens = lambda request: 1
        assert (await s.client.post(GENERATE, json=body())).json()["usage"]["prompt_tokens_details"] is None


async def test_return_tokens_as_token_ids_names_text_logprob_tokens_by_id(demo_model):
    async with serve(demo_model, "--return-tokens-as-token-ids") as s:
        r = await s.client.post(GENERATE, json=body("text", sampling_params={"logprobs": 1}))
        content = r.json()["choices"][0]["logprobs"]["content"]
        assert [c["token"] for c in content] == [f"token_id:{t}" for t in SCRIPT] + ["token_id:151645"]
        assert all(c["bytes"] is None for c in content)
        assert all(top["token"].startswith("token_id:") for c in content for top in c["top_logprobs"])
    async with serve(demo_model) as s:
        r = await s.client.post(GENERATE, json=body("text", sampling_params={"logprobs": 1}))
        content = r.json()["choices"][0]["logprobs"]["content"]
        assert [c["token"] for c in content[:2]] == ["Hello", ","] and content[0]["bytes"] == list(b"Hello")


# ------------------------------------------------------------------ access-line flags


async def test_access_line_flags_drop_the_line(demo_model, caplog):
    caplog.set_level(logging.INFO, logger="decode_server.access")
    for flags in (("--disable-access-log-for-endpoints", f"/health,{GENERATE}"), ("--disable-uvicorn-access-log",)):
        async with serve(demo_model, *flags) as s:
            assert (await s.client.post(GENERATE, json=body(request_id="unlogged"))).status_code == 200
    async with serve(demo_model, "--disable-access-log-for-endpoints", "/health") as s:
        assert (await s.client.post(GENERATE, json=body(request_id="logged"))).status_code == 200
    lines = [r.fields["request_id"] for r in caplog.records if r.name == "decode_server.access"]
    assert lines == ["logged"]


# ------------------------------------------------------------------ keep-alive comments and /load, on a socket


def test_keep_alive_comments_keep_a_silent_stream_open_and_load_counts_it(demo_model):
    """A request held after its first token: the stream sends nothing but `: keep-alive` lines, one a
    second, and /load counts it until it ends."""
    with loopback(demo_model, "--sse-keep-alive-interval", "1", "--enable-server-load-tracking") as srv:
        gate = srv.call(srv.core.hold, "silent", 1)
        comments: list[float] = []
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            assert client.get("/load").json() == {"server_load": 0}
            opened = time.monotonic()
            with client.stream("POST", GENERATE, json={**body(request_id="silent"), "stream": True}) as r:
                lines, held = r.iter_lines(), []
                for line in lines:
                    if line == ": keep-alive":
                        comments.append(time.monotonic() - opened)
                        if len(comments) == 2:
                            break
                    elif line:
                        held.append(line)
                assert len(held) == 1 and held[0].startswith("data: {"), f"the first token, then only comments: {held}"
                srv.wait(gate.reached())
                assert client.get("/load").json() == {"server_load": 1}
                srv.call(gate.release)
                rest = [line for line in lines if line.startswith("data: ")]
            assert rest[-1] == "data: [DONE]" and '"finish_reason":"stop"' in rest[-2].replace(" ", "")
            assert client.get("/load").json() == {"server_load": 0}
        # A comment a second (each after a full interval's sleep), not faster: the second one
        # cannot arrive before two seconds have passed.
        assert comments[1] >= 2.0, comments


def test_keep_alive_comments_wait_for_the_answer_of_a_request_held_before_its_first_token(demo_model):
    """A stream's first token decides its answer (a refusal there is a 4xx, not a 200 with an error
    event): held before it, past two keep-alive intervals, the request gets no comment into a response
    not yet started, then a whole 200 stream."""
    with loopback(demo_model, "--sse-keep-alive-interval", "1") as srv:
        gate = srv.call(srv.core.hold, "prefill")

        def stream() -> tuple[float, int, list[str]]:
            with httpx.Client(base_url=srv.url, timeout=30) as client:
                with client.stream("POST", GENERATE, json={**body(request_id="prefill"), "stream": True}) as r:
                    return time.monotonic(), r.status_code, [line for line in r.iter_lines() if line]

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(stream)
            srv.wait(gate.reached())
            time.sleep(2.5)
            released = time.monotonic()
            srv.call(gate.release)
            answered, status, lines = answer.result(timeout=30)
        assert answered >= released and status == 200, (answered - released, status)
        assert lines[0].startswith("data: {") and lines[-1] == "data: [DONE]", lines
        assert '"finish_reason":"stop"' in lines[-2].replace(" ", ""), lines


async def test_load_is_null_without_load_tracking(inproc):
    gate = inproc.core.hold("untracked", after_tokens=1)
    stream = asyncio.create_task(inproc.events(body(request_id="untracked")))
    await gate.reached()
    assert (await inproc.client.get("/load")).json() == {"server_load": None}
    gate.release()
    assert (await stream)[-1] == "[DONE]"


# ------------------------------------------------------------------ vLLM's prefill backlog limit


async def test_the_prefill_token_backlog_limit_is_a_503_with_retry_after_and_vllms_message(demo_model):
    # --max-num-queued-reqs is in tests/app/generate/test_admission.py; this is its token-count sibling: every
    # prompt token of a request that has not finished prefill counts (vLLM's OutputProcessor).
    async with serve(demo_model, "--max-num-queued-tokens", str(len(PROMPT))) as s:
        gate = s.core.hold("queued")
        queued = asyncio.create_task(s.client.post(GENERATE, json=body(request_id="queued")))
        await gate.reached()
        r = await s.client.post(GENERATE, json=body(request_id="over"))
        assert error_of(r) == (503, PREFILL_BACKLOG, None) and r.headers["retry-after"] == "1"
        assert await s.metric("decode_server_rejections_total", reason="engine_overload") == 1
        assert await s.metric("vllm:admission_rejections_total", reason="max_num_queued_tokens") == 1
        gate.release()
        assert (await queued).status_code == 200
        assert (await s.client.post(GENERATE, json=body(request_id="after"))).status_code == 200
