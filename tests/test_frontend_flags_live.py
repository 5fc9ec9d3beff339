"""`vllm serve` frontend flags doing on a real engine what they do on vLLM (issue #13)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests import servers
from tests.support import GENERATE, scripted

KEYS = ("first-key", "second-key")
PROMPT = [9707, 1879]


@pytest.fixture(scope="module")
def flagged(demo_model, log_dir):
    server = servers.ours(
        "flags", demo_model, log_dir, *servers.PARSER_FLAGS,
        "--api-key", *KEYS,
        "--enable-prompt-tokens-details", "--return-tokens-as-token-ids",
        "--sse-keep-alive-interval", "1", "--enable-server-load-tracking",
        "--allowed-origins", '["https://ui.example"]',
        "--disable-access-log-for-endpoints", "/inference/v1/generate",
        "--middleware", "tests.support.tag_response",
        "--response-role", "narrator", "--enable-scale-out", "--max-log-len", "5",
    ).start()
    yield server
    server.stop()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_each_api_key_is_accepted_and_others_get_401_with_the_reason(flagged):
    for key in KEYS:
        r = httpx.post(flagged.url + GENERATE, json=scripted(PROMPT, [11]), headers=_auth(key))
        assert r.status_code == 200, r.text
    r = httpx.post(flagged.url + GENERATE, json=scripted(PROMPT, [11]), headers=_auth("third"))
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]


def test_prompt_token_details_and_token_id_logprobs(flagged):
    body = scripted(PROMPT, [11, 12], output_mode="text", sampling_params={"logprobs": 1})
    r = httpx.post(flagged.url + GENERATE, json=body, headers=_auth(KEYS[0]))
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out["usage"]["prompt_tokens_details"]["cached_tokens"], int)
    content = out["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content[:2]] == ["token_id:11", "token_id:12"]
    assert content[0]["bytes"] is None


def test_keep_alive_comments_and_the_load_endpoint_during_a_stream(flagged):
    lines: list[str] = []
    # (seconds since the reader began holding the stream open, server_load), one per /load read.
    loads: list[tuple[float, int]] = []
    body = scripted(PROMPT, [], sampling_params={"max_tokens": 3000, "ignore_eos": True}, stream=True)

    holding = threading.Event()
    measured = threading.Event()

    def read() -> None:
        with httpx.stream("POST", flagged.url + GENERATE, json=body, headers=_auth(KEYS[0]), timeout=60) as r:
            for line in r.iter_lines():
                lines.append(line)
                if line == ": keep-alive":
                    # The stream stays open (its response unfinished) until /load was read.
                    holding.set()
                    measured.wait(30)
                    break

    # /load is read only while the reader holds the stream open: how soon the main thread
    # gets to run after the first line (CI saw over a second) cannot decide the test.
    with httpx.Client(base_url=flagged.url) as client:
        reader = threading.Thread(target=read)
        reader.start()
        try:
            assert holding.wait(30), f"no `: keep-alive` comment line in the stream's first 30 s: {lines[:6]}"
            held_at = time.monotonic()
            for _ in range(5):
                loads.append((time.monotonic() - held_at, client.get("/load").json()["server_load"]))
                if loads[-1][1] >= 1:
                    break
                time.sleep(0.1)
        finally:
            measured.set()
            reader.join(30)
    assert max(load for _, load in loads) >= 1, f"/load while the stream was open ({len(lines)} lines read): {loads}"
    deadline = time.monotonic() + 10
    while httpx.get(flagged.url + "/load").json()["server_load"] != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert httpx.get(flagged.url + "/load").json() == {"server_load": 0}


def test_cors_middleware_role_and_access_log_flags(flagged):
    preflight = httpx.options(
        flagged.url + GENERATE,
        headers={"Origin": "https://ui.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "https://ui.example"
    ctx = {"chat_template_kwargs": {"enable_thinking": False}}
    body = scripted(PROMPT, [9707], output_mode="derender", parse_context=ctx, request_id="no-access-line")
    events = []
    with httpx.stream("POST", flagged.url + GENERATE, json={**body, "stream": True}, headers=_auth(KEYS[1])) as r:
        assert r.headers["x-operator-middleware"] == "seen"
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[0]["choices"][0]["delta"] == {"role": "narrator", "content": ""}
    log = flagged.log_path.read_text()
    assert "no-access-line" not in log, "--disable-access-log-for-endpoints drops the generate access line"
    assert "--max-log-len has no meaning for decode-server" in log
