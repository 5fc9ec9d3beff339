"""Operating it, on a real engine: auth, metrics after traffic, JSON access log, the typed client."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from protocol.clients.generate import AsyncClient, Client
from protocol.errors import GenerateError
from tests import servers
from tests.support import scripted

KEY = "s3cret-key"
PROMPT = [9707, 1879]
IM_END = 151645
GUARDED = ["/inference/v1/generate", "/inference/v1/abort_requests", "/abort_requests"]


@pytest.fixture(scope="module")
def prod_server(demo_model, log_dir):
    server = servers.ours(
        "prod", demo_model, log_dir, *servers.PARSER_FLAGS, "--api-key", KEY, "--log-format", "json"
    ).start()
    yield server
    server.stop()


def _auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("path", GUARDED)
@pytest.mark.parametrize("headers", [{}, _auth("wrong"), {"Authorization": KEY}], ids=["none", "wrong", "no-bearer"])
def test_guarded_routes_reject_without_the_key(prod_server, path, headers):
    r = httpx.post(prod_server.url + path, json={"token_ids": PROMPT, "request_ids": []}, headers=headers)
    assert r.status_code == 401
    assert "API key" in r.json()["error"]["message"]


def test_guarded_routes_accept_the_key_and_probes_stay_open(prod_server):
    r = httpx.post(prod_server.url + GUARDED[0], json={"token_ids": PROMPT, "sampling_params": {"max_tokens": 2}}, headers=_auth())
    assert r.status_code == 200
    for path in GUARDED[1:]:
        assert httpx.post(prod_server.url + path, json={"request_ids": ["x"]}, headers=_auth()).status_code == 200
    for path in ("/health", "/ready", "/metrics", "/v1/models", "/version", "/openapi.json"):
        assert httpx.get(prod_server.url + path).status_code == 200, path


def _samples(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _sum(samples: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(prefix))


def test_typed_client_and_metrics_after_traffic(prod_server):
    with Client(prod_server.url, api_key=KEY) as client:
        tokens = client.generate(scripted(PROMPT, [9707, 11]))
        assert tokens.choices[0].token_ids == [9707, 11, IM_END]
        text = client.generate(scripted(PROMPT, [9707, 11], output_mode="text"))
        assert text.choices[0].text == "Hello,"
        ctx = {"chat_template_kwargs": {"enable_thinking": False}}
        derender = client.generate(scripted(PROMPT, [9707, 11], output_mode="derender", parse_context=ctx))
        assert derender.choices[0].message.content == "Hello,"
        chunks = list(client.stream(scripted(PROMPT, [9707, 11, 1879], output_mode="text")))
        assert "".join(c.choices[0].text for c in chunks) == "Hello, world"
        with pytest.raises(GenerateError) as err:
            client.generate({"token_ids": PROMPT, "output_mode": "text", "sampling_params": {"detokenize": False}})
        assert err.value.status == 400 and "detokenize" in err.value.message

    async def abort_one() -> list:
        async with AsyncClient(prod_server.url, api_key=KEY) as client:
            body = scripted(PROMPT, [], request_id="metrics-abort", sampling_params={"max_tokens": 2000, "ignore_eos": True})
            seen = []
            async for chunk in client.stream(body):
                seen.append(chunk)
                if len(seen) == 2:
                    await client.abort(["metrics-abort"])
            return seen

    seen = asyncio.run(abort_one())
    assert seen[-1].choices[0].finish_reason == "abort"

    m = _samples(prod_server.url)
    assert _sum(m, 'decode_server_requests_total{output_mode="text",status="200"}') >= 2
    assert _sum(m, 'decode_server_requests_total{output_mode="derender",status="200"}') >= 1
    assert _sum(m, 'decode_server_requests_total{output_mode="text",status="400"}') >= 1
    assert _sum(m, "decode_server_time_to_first_token_seconds_count") >= 4
    assert _sum(m, 'decode_server_inter_token_latency_seconds_count{output_mode="tokens"}') > 0
    assert _sum(m, 'decode_server_aborts_total{cause="abort_endpoint"}') >= 1
    assert _sum(m, 'decode_server_rejections_total{reason="detokenize_false"}') >= 1
    assert _sum(m, "decode_server_frontend_cpu_seconds") > 0
    assert _sum(m, "decode_server_requests_in_flight") == 0
    assert _sum(m, "vllm:generation_tokens_total") > 0
    assert _sum(m, "vllm:request_success_total") > 0


def test_one_json_access_line_per_request(prod_server):
    r = httpx.post(
        prod_server.url + GUARDED[0],
        json=scripted(PROMPT, [9707], output_mode="text"),
        headers={**_auth(), "X-Request-Id": "access-line-1"},
    )
    assert r.status_code == 200
    lines = [json.loads(line) for line in prod_server.log_path.read_text().splitlines() if line.startswith("{")]
    access = [entry for entry in lines if entry.get("request_id") == "access-line-1"]
    assert len(access) == 1
    entry = access[0]
    assert entry["logger"] == "decode_server.access"
    assert entry["output_mode"] == "text" and entry["status"] == 200
    assert entry["prompt_tokens"] == 2 and entry["output_tokens"] == 2
    assert entry["ttft_ms"] is not None and entry["duration_ms"] >= entry["ttft_ms"]
