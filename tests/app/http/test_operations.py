"""Operating it, in process: the typed clients against our app, the metrics a known mix of traffic
leaves (exact counts and label values) and the JSON access line, over the scripted engine.

The real-engine checks of the same features are in test_operations.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest

from decode_server.runtime.access_log import JsonFormatter
from protocol.clients.generate import AsyncClient, Client
from protocol.errors import GenerateError
from tests.support.inprocess import BASE_URL, NO_THINKING, PROMPT, serve
from tests.support.asgi_stream import StreamingASGITransport
from tests.support.loopback import loopback
from tests.support.servers import PARSER_FLAGS
from tests.support import scripted

KEY = "s3cret-key"
IM_END = 151645
UNAUTHORIZED = "missing or wrong API key (send 'Authorization: Bearer <key>')"


def test_typed_clients_against_our_app_and_the_metrics_they_leave(demo_model):
    with loopback(demo_model, *PARSER_FLAGS, "--api-key", KEY) as srv:
        with Client(srv.url, api_key=KEY) as client:
            tokens = client.generate(scripted(PROMPT, [9707, 11]))
            assert tokens.choices[0].token_ids == [9707, 11, IM_END]
            text = client.generate(scripted(PROMPT, [9707, 11], output_mode="text"))
            assert (text.choices[0].text, text.usage.completion_tokens) == ("Hello,", 3)
            derender = client.generate(scripted(PROMPT, [9707, 11], output_mode="derender", parse_context=NO_THINKING))
            assert (derender.choices[0].message.role, derender.choices[0].message.content) == ("assistant", "Hello,")
            chunks = list(client.stream(scripted(PROMPT, [9707, 11, 1879], output_mode="text")))
            assert [c.choices[0].text for c in chunks] == ["Hello", ",", " world", ""]
            assert chunks[-1].choices[0].finish_reason == "stop"
            with pytest.raises(GenerateError) as err:
                client.generate({"token_ids": PROMPT, "output_mode": "text", "sampling_params": {"detokenize": False}})
            assert (err.value.status, err.value.param) == (400, "sampling_params.detokenize")
            assert err.value.message == "output_mode='text' requires sampling_params.detokenize to be true"
        with Client(srv.url, api_key="wrong") as client, pytest.raises(GenerateError) as err:
            client.generate(scripted(PROMPT, [11]))
        assert (err.value.status, err.value.message) == (401, UNAUTHORIZED)

        # Held after two tokens: the stream has sent exactly those when the abort arrives.
        srv.call(srv.core.hold, "metrics-abort", 2)

        async def abort_after_two() -> list:
            async with AsyncClient(srv.url, api_key=KEY) as client:
                seen = []
                async for chunk in client.stream(scripted(PROMPT, [9707, 11, 1879], request_id="metrics-abort")):
                    seen.append(chunk)
                    if len(seen) == 2:
                        await client.abort(["metrics-abort"])
                return seen

        seen = asyncio.run(abort_after_two())
        assert [c.choices[0].token_ids for c in seen] == [[9707], [11], []]
        assert seen[-1].choices[0].finish_reason == "abort"

        requests = {(mode, status): srv.metric("decode_server_requests_total", output_mode=mode, status=status)
                    for mode, status in [("tokens", "200"), ("text", "200"), ("derender", "200"), ("text", "400")]}
        assert requests == {("tokens", "200"): 2, ("text", "200"): 2, ("derender", "200"): 1, ("text", "400"): 1}
        assert srv.metric("decode_server_requests_total") == 6, "a 401 never reaches the app's bookkeeping"
        assert srv.metric("decode_server_time_to_first_token_seconds_count") == 5
        assert srv.metric("decode_server_time_to_first_token_seconds_count", output_mode="derender") == 1
        # One inter-token sample per streamed token after each stream's first (EOS is one; an
        # abort's closing chunk brings none), however the writes grouped them; batch answers have none.
        assert srv.metric("decode_server_inter_token_latency_seconds_count", output_mode="text") == 3
        assert srv.metric("decode_server_inter_token_latency_seconds_count", output_mode="tokens") == 1
        assert srv.metric("decode_server_aborts_total", cause="abort_endpoint") == 1
        assert srv.metric("decode_server_aborts_total", cause="engine_abort") == 1
        assert srv.metric("decode_server_rejections_total", reason="detokenize_false") == 1
        assert srv.metric("decode_server_rejections_total") == 1
        assert srv.metric("decode_server_frontend_cpu_seconds") > 0
        assert srv.metric("decode_server_requests_in_flight") == 0
        # vLLM's own stat logger, fed by the same engine outputs.
        assert srv.metric("vllm:request_success_total", finished_reason="stop") == 4
        assert srv.metric("vllm:generation_tokens_total") == 3 + 3 + 3 + 4 + 2
        assert srv.metric("vllm:prompt_tokens_total") == 2 * 5


@pytest.mark.anyio
async def test_one_json_access_line_per_request(demo_model, caplog):
    caplog.set_level(logging.INFO, logger="decode_server.access")
    async with serve(demo_model, *PARSER_FLAGS) as s:
        r = await s.client.post("/inference/v1/generate", json=scripted(PROMPT, [9707], output_mode="text"),
                                headers={"X-Request-Id": "access-line-1"})
        assert r.status_code == 200, r.text
        async with AsyncClient(BASE_URL, transport=StreamingASGITransport(s.app)) as client:
            chunks = [c async for c in client.stream(scripted(PROMPT, [9707, 11], request_id="access-line-2"))]
            assert chunks[-1].choices[0].finish_reason == "stop"
            with pytest.raises(GenerateError):
                await client.generate(scripted(PROMPT, [11], request_id="access-line-3", sampling_params={"logprobs": 21}))
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records if r.name == "decode_server.access"]
    assert [line["request_id"] for line in lines] == ["access-line-1", "access-line-2", "access-line-3"]
    for line in lines:
        assert (line["logger"], line["level"], line["pid"]) == ("decode_server.access", "info", os.getpid())
        assert set(line) == {"ts", "level", "logger", "process", "pid", "request_id", "output_mode", "status",
                             "prompt_tokens", "output_tokens", "ttft_ms", "duration_ms"}
    batch, stream, refused = lines
    assert (batch["output_mode"], batch["status"], batch["prompt_tokens"], batch["output_tokens"]) == ("text", 200, 2, 2)
    assert (stream["output_mode"], stream["status"], stream["prompt_tokens"], stream["output_tokens"]) == ("tokens", 200, 2, 3)
    for done in (batch, stream):
        assert 0 <= done["ttft_ms"] <= done["duration_ms"]
    assert (refused["status"], refused["output_tokens"], refused["ttft_ms"]) == (400, 0, None)
