"""Admission, error mapping, headers, auth, drain, engine death and bookkeeping, in process.

The real app (its CLI config, lifespan, Lifecycle and Engine) over the scripted engine: every
route and service rule here runs in milliseconds, with the engine's state set by the test (a held
request, a dead core) instead of waited for.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateTokensResponse, GenerateTokensStreamResponse

from protocol.generate import FINGERPRINT_HEADER as FINGERPRINT
from protocol.generate import MODE_TYPES, UsageChunk
from tests.support.inprocess import PROMPT, body_for, error_of, serve
from tests.support.servers import PARSER_FLAGS
from tests.support import GENERATE

pytestmark = pytest.mark.anyio

IM_END = 151645
SCRIPT = [9707, 11, 1879, 0]  # "Hello, world!"
DRAINING = "the server is draining (shutting down); retry on another replica"
DEAD = "the engine is dead; this server will restart"


def body(mode: str = "tokens", **fields):
    return body_for(mode, SCRIPT, **fields)


# ------------------------------------------------------------------ error mapping and rule order


async def test_each_refusal_has_its_status_message_and_reason(demo_model):
    async with serve(demo_model, *PARSER_FLAGS, "--max-request-bytes", "2000") as s:
        cases = [
            (dict(content=b"{" + b" " * 3000 + b"}"), 413, "request body exceeds 2000 bytes", None, "too_large"),
            (dict(content=b"not json"), 400, "request body is not valid JSON", None, "invalid_json"),
            (dict(json={"token_ids": "abc"}), 400, "invalid request: Expected `array`", None, "invalid_field"),
            (dict(json={**body(), "model": "nope"}), 404, "The model `nope` does not exist.", "model", "unknown_model"),
            (dict(json=body(), headers={FINGERPRINT: "0" * 16}), 409, "parser configuration drift", FINGERPRINT, "fingerprint_mismatch"),
            (dict(json=body(sampling_params={"logprobs": 21})), 400, "exceeds the server's max_logprobs (20)", "sampling_params.logprobs", "logprobs_above_max"),
            (dict(json=body(), headers={"X-Request-Id": "bad\tid"}), 400, "printable ASCII", "request_id", "invalid_request_id"),
        ]
        for kwargs, status, message, param, reason in cases:
            r = await s.client.post(GENERATE, **kwargs)
            code, got, got_param = error_of(r)
            assert (code, got_param) == (status, param) and message in got, (reason, r.text)
            assert await s.metric("decode_server_rejections_total", reason=reason) == 1, reason
        # Refused before the body named its output mode: JSON, schema, request id.
        assert await s.metric("decode_server_requests_total", output_mode="unknown", status="400") == 3
        assert await s.metric("decode_server_requests_total", output_mode="unknown", status="413") == 1
        assert await s.metric("decode_server_requests_total", output_mode="tokens", status="404") == 1
        assert await s.metric("decode_server_requests_in_flight") == 0


async def test_rules_run_in_admission_order(demo_model):
    """draining/dead → size → JSON → fingerprint → model → sampling rules: the first that fails answers."""
    async with serve(demo_model, *PARSER_FLAGS, "--max-request-bytes", "2000") as s:
        bad_everything = {**body(sampling_params={"logprobs": 21}), "model": "nope"}
        code, message, _ = error_of(await s.client.post(GENERATE, json=bad_everything, headers={FINGERPRINT: "x"}))
        assert code == 409 and "drift" in message, "fingerprint before model"
        code, message, _ = error_of(await s.client.post(GENERATE, json=bad_everything))
        assert code == 404 and "nope" in message, "model before sampling rules"
        code, message, _ = error_of(await s.client.post(GENERATE, content=b"{oops", headers={FINGERPRINT: "x"}))
        assert code == 400 and "not valid JSON" in message, "decoding before fingerprint"
        code, message, _ = error_of(await s.client.post(GENERATE, content=b"{" + b" " * 3000))
        assert code == 413 and "exceeds 2000 bytes" in message, "size before decoding"
        s.lifecycle.begin_drain()
        r = await s.client.post(GENERATE, content=b"{" + b" " * 3000)
        assert error_of(r) == (503, DRAINING, None), "draining before reading the body"
        s.core.die()
        r = await s.client.post(GENERATE, json=body())
        assert error_of(r) == (503, DEAD, None), "a dead engine before draining"
        assert r.headers["retry-after"] == "1"


async def test_sampling_rules_surface_vllms_message(inproc):
    code, message, param = error_of(await inproc.client.post(GENERATE, json=body(sampling_params={"temperature": -1})))
    assert (code, param) == (400, "sampling_params.temperature") and "temperature must be non-negative" in message
    r = await inproc.client.post(GENERATE, json=body(mode="text", sampling_params={"detokenize": False}))
    assert error_of(r) == (400, "output_mode='text' requires sampling_params.detokenize to be true", "sampling_params.detokenize")


async def test_tokens_only_refuses_text_levels_and_stop_strings(demo_model):
    async with serve(demo_model, "--tokens-only") as s:
        r = await s.client.post(GENERATE, json=body())
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == SCRIPT + [IM_END]
        for mode in ("text", "derender"):
            code, message, param = error_of(await s.client.post(GENERATE, json=body(mode)))
            assert (code, param) == (400, "output_mode") and "requires a tokenizer" in message
        code, message, param = error_of(await s.client.post(GENERATE, json=body(sampling_params={"stop": ["x"]})))
        assert (code, param) == (400, "sampling_params.stop")
        assert "stop strings are not supported on a --tokens-only server" in message


# ------------------------------------------------------------------ headers


async def test_request_id_header_names_the_request_and_is_echoed(inproc):
    r = await inproc.client.post(GENERATE, json=body(request_id="from-body"), headers={"X-Request-Id": "from-header"})
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == "from-header"
    assert r.json()["request_id"] == "generate-tokens-from-header"
    assert inproc.core.seen[-1].external_req_id.endswith("-from-header")
    r = await inproc.client.post(GENERATE, json=body(request_id="from-body"))
    assert (r.headers["x-request-id"], r.json()["request_id"]) == ("from-body", "generate-tokens-from-body")


async def test_every_answer_carries_the_published_fingerprint_and_a_match_is_served(inproc):
    published = (await inproc.client.get("/v1/models")).json()["data"][0]["parser_fingerprint"]
    r = await inproc.client.post(GENERATE, json=body(), headers={FINGERPRINT: published})
    assert r.status_code == 200 and r.headers[FINGERPRINT] == published
    async with inproc.client.stream("POST", GENERATE, json={**body(), "stream": True}) as stream:
        assert stream.headers[FINGERPRINT] == published


async def test_engine_headers_and_the_request_reach_the_engine(inproc):
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    headers = {"X-data-parallel-rank": "0", "X-Session-ID": "s-1", "traceparent": traceparent}
    r = await inproc.client.post(GENERATE, json=body(cache_salt="salt", priority=0), headers=headers)
    assert r.status_code == 200, r.text
    sent = inproc.core.seen[-1]
    assert (sent.prompt_token_ids, sent.cache_salt, sent.session_id, sent.data_parallel_rank) == (PROMPT, "salt", "s-1", 0)
    assert sent.sampling_params.extra_args["replay_token_ids"] == SCRIPT
    # vLLM drops trace headers unless an OTLP endpoint is configured (as it does for its own server).
    assert sent.trace_headers is None


# ------------------------------------------------------------------ auth


async def test_api_keys_guard_generate_and_abort_and_leave_probes_open(demo_model):
    async with serve(demo_model, "--api-key", "k1", "k2") as s:
        for path in (GENERATE, "/inference/v1/abort_requests", "/abort_requests"):
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "k1"}):
                r = await s.client.post(path, json={"request_ids": []}, headers=headers)
                assert error_of(r) == (401, "missing or wrong API key (send 'Authorization: Bearer <key>')", None)
        for key in ("k1", "k2"):
            r = await s.client.post(GENERATE, json=body(), headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
        for path in ("/health", "/ready", "/metrics", "/v1/models", "/version", "/openapi.json"):
            assert (await s.client.get(path)).status_code == 200, path


# ------------------------------------------------------------------ drain and engine death


async def test_drain_refuses_new_requests_and_lets_open_ones_finish(inproc):
    gate = inproc.core.hold("open", after_tokens=1)
    stream = asyncio.create_task(inproc.events(body(request_id="open")))
    await gate.reached()
    inproc.lifecycle.begin_drain()
    r = await inproc.client.post(GENERATE, json=body())
    assert error_of(r) == (503, DRAINING, None) and r.headers["retry-after"] == "1"
    assert error_of(await inproc.client.get("/ready")) == (503, "draining", None)
    assert (await inproc.client.get("/health")).status_code == 200
    gate.release()
    events = await stream
    assert [t for e in events[:-1] for c in e["choices"] for t in c["token_ids"]] == SCRIPT + [IM_END]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_the_drain_deadline_aborts_what_is_left(demo_model):
    async with serve(demo_model, "--shutdown-timeout", "0") as s:
        gate = s.core.hold("left", after_tokens=1)
        stream = asyncio.create_task(s.events(body(request_id="left")))
        await gate.reached()
        s.lifecycle.begin_drain()
        events = await asyncio.wait_for(stream, 10)
        assert events[-2]["choices"][0]["finish_reason"] == "abort"
        assert await s.metric("decode_server_aborts_total", cause="drain") == 1
        assert s.engine.live_request_count() == 0


async def test_engine_death_fails_health_new_requests_and_open_streams(inproc):
    gate = inproc.core.hold("open", after_tokens=1)
    stream = asyncio.create_task(inproc.events(body(request_id="open")))
    await gate.reached()
    inproc.core.die()
    events = await asyncio.wait_for(stream, 10)
    assert events[0]["choices"][0]["token_ids"] == [SCRIPT[0]]
    assert events[-2] == {"error": {"message": DEAD, "type": "ServiceUnavailableError", "param": None, "code": 503}}
    assert events[-1] == "[DONE]"
    assert error_of(await inproc.client.get("/health")) == (503, "the engine is dead", None)
    assert error_of(await inproc.client.post(GENERATE, json=body())) == (503, DEAD, None)
    for _ in range(40):  # the watchdog looks every ENGINE_WATCH_INTERVAL_S
        if inproc.lifecycle.engine_died:
            break
        await asyncio.sleep(0.05)
    assert inproc.lifecycle.exit_code == 1


async def test_a_request_the_engine_fails_is_a_500_or_an_error_event(inproc):
    inproc.core.fail("batch")
    r = await inproc.client.post(GENERATE, json=body(request_id="batch"))
    assert error_of(r) == (500, "Internal server error", None)
    inproc.core.fail("stream", after_tokens=1)
    events = await inproc.events(body(request_id="stream"))
    assert events[-2]["error"]["code"] == 500 and events[-2]["error"]["message"] == "Internal server error"
    assert await inproc.metric("decode_server_rejections_total", reason="engine") == 2


# ------------------------------------------------------------------ wire shape


@pytest.mark.parametrize("mode", ["tokens", "text", "derender"])
async def test_batch_body_has_the_modes_wire_shape(inproc, mode):
    r = await inproc.client.post(GENERATE, json=body(mode, request_id=f"shape-{mode}"))
    assert r.status_code == 200, r.text
    types = MODE_TYPES[mode]
    parsed = msgspec.json.decode(r.content, type=types.response)
    assert set(r.json()) == set(types.response.__struct_fields__)
    assert set(r.json()["choices"][0]) == set(types.choice.__struct_fields__)
    choice = parsed.choices[0]
    assert (choice.token_ids, choice.finish_reason, choice.stop_reason) == (SCRIPT + [IM_END], "stop", None)
    assert (parsed.request_id, parsed.model, parsed.usage.completion_tokens) == (f"generate-tokens-shape-{mode}", "demo", 5)
    if mode == "tokens":
        GenerateTokensResponse.model_validate(r.json())
    elif mode == "text":
        assert choice.text == "Hello, world!"
    else:
        assert (choice.message.role, choice.message.content) == ("assistant", "Hello, world!")


@pytest.mark.parametrize("mode", ["tokens", "text", "derender"])
async def test_stream_chunks_have_the_modes_wire_shape(inproc, mode):
    events = await inproc.events(body(mode, stream_options={"include_usage": True}))
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    for chunk in chunks:
        msgspec.convert(chunk, MODE_TYPES[mode].chunk)
        if mode == "tokens":
            GenerateTokensStreamResponse.model_validate(chunk)
    usage = msgspec.convert(usage, UsageChunk)
    assert (usage.choices, usage.usage.completion_tokens, usage.usage.prompt_tokens) == ([], 5, 2)
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == SCRIPT + [IM_END]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    if mode == "text":
        assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello, world!"
    if mode == "derender":
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hello, world!"


async def test_a_stream_sends_one_chunk_per_engine_step(inproc):
    inproc.core.tokens_per_step = 2
    events = await inproc.events(body())
    assert [c["choices"][0]["token_ids"] for c in events[:-1]] == [SCRIPT[:2], SCRIPT[2:], [IM_END]]


async def test_vllms_queue_limit_is_a_503_with_retry_after_and_its_message(demo_model, caplog):
    # vLLM counts every unfinished request against --max-num-queued-reqs (its AsyncLLM does, here too).
    async with serve(demo_model, "--max-num-seqs", "1", "--max-num-queued-reqs", "1") as s:
        gate = s.core.hold("run", after_tokens=1)
        running = asyncio.create_task(s.client.post(GENERATE, json=body(request_id="run")))
        await gate.reached()
        code, message, _ = error_of(r := await s.client.post(GENERATE, json=body(request_id="over")))
        assert (code, r.headers["retry-after"]) == (503, "1") and "busy" in message, "vLLM's QueueOverflowError"
        # A stream's response awaits its first token before it answers: the same refusal, not a 200.
        streamed = await s.client.post(GENERATE, json={**body(request_id="over-stream"), "stream": True})
        assert (error_of(streamed), streamed.headers["retry-after"]) == ((code, message, None), "1")
        assert await s.metric("decode_server_rejections_total", reason="engine_overload") == 2
        gate.release()
        assert (await running).status_code == 200
    assert not [rec for rec in caplog.records if rec.exc_info], "no stack trace for an overload"
