"""Operating it on a real engine: one server with every frontend flag (tests/support/prod_server.py, shared
with the LoRA checks), one check per feature, then its end: SIGTERM to its process group with
streams of every mode in flight (the drain, scraped by a real Prometheus), and its whole log read
back as JSON (these two run after every other test).

The HTTP detail of each (every guarded route, exact metric values, CORS refusals, access-line
flags, keep-alive pacing, the clients' error paths, the fuzz) runs in process over the scripted
engine: tests/app/http/test_operations.py, tests/app/process/test_frontend_flags.py,
tests/app/generate/test_admission.py, tests/app/http/test_fuzz_api.py. Here the real process proves its wiring: the CLI, uvicorn, the log
configuration, and the engine's own outputs (logprobs, cached tokens, vLLM's queue limit).
(`--disable-access-log-for-endpoints` would silence the access line checked here: in process only.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import httpx
import psutil
import pytest

from protocol.clients.generate import AsyncClient, Client
from protocol.errors import GenerateError
from tests.support.inprocess import body_for
from tests.support.observability_queries import Query, dashboard_queries, load_dashboard, selectors
from tests.support.processes import detached_engine_cores, wait_ended
from tests.support.prod_server import DRAIN_STREAMS, DRAIN_WINDOW_S, KEYS, ORIGIN, QUEUE_LIMIT, auth
from tests.support.prometheus_server import Prometheus
from tests.support.stream_reader import StreamReader
from tests.support import GENERATE, choice_chunks, finish_reason, joined_text, joined_tokens, metric_sum, scripted

pytestmark = pytest.mark.real_engine

PROMPT = [9707, 11]
IM_END = 151645
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
UNAUTHORIZED = "missing or wrong API key (send 'Authorization: Bearer <key>')"
LONG = {"max_tokens": 4000, "ignore_eos": True}  # past any drain's streams: it ends when aborted
MODES = ("tokens", "text", "derender")
# Each drained stream's tokens: long enough that all are still open when the signal comes, short
# enough to end well inside the window on 2 shared cores; the drain's time is theirs (this server,
# LoRA enabled, steps its 17 streams at ~2 tokens/s each on a 2-core box: 16 streams of 128 tokens
# drained in 72 s, of 256 in 98 s). Eager engines once ran 64 tokens on a quiet machine before the
# last stream's first event, when a client was built between streams; since every stream's
# connection is opened first, the furthest had 2 events then (the test prints it). 64, not 32: a
# quiet machine's pacing was never measured with the connections opened first, and 64 still drains
# in about half the old time.
DRAIN_SCRIPT = [9707] * 64


@pytest.fixture
def http(prod_server):
    # A real engine on a shared machine can take seconds for one answer (httpx's default is 5 s).
    with httpx.Client(base_url=prod_server.url, timeout=120) as client:
        yield client


def test_api_keys_guard_generate_and_abort_and_probes_stay_open(http):
    for key in KEYS:
        r = http.post(GENERATE, json=scripted(PROMPT, [11]), headers=auth(key))
        assert r.status_code == 200, r.text
    for path in (GENERATE, "/abort_requests"):
        r = http.post(path, json={"token_ids": PROMPT, "request_ids": []}, headers=auth("third"))
        assert r.status_code == 401 and r.json()["error"]["message"] == UNAUTHORIZED, path
    for path in ("/health", "/ready", "/metrics", "/v1/models", "/version", "/openapi.json"):
        assert http.get(path).status_code == 200, path


def _metric(http: httpx.Client, name: str, **labels: str) -> float:
    return metric_sum(http.get("/metrics").text, name, **labels)


def test_typed_clients_and_metrics_after_traffic(prod_server, http):
    with Client(prod_server.url, api_key=KEYS[0]) as client:
        tokens = client.generate(scripted(PROMPT, [9707, 11]))
        assert tokens.choices[0].token_ids == [9707, 11, IM_END]
        text = client.generate(scripted(PROMPT, [9707, 11], output_mode="text"))
        assert text.choices[0].text == "Hello,"
        derender = client.generate(scripted(PROMPT, [9707, 11], output_mode="derender", parse_context=NO_THINKING))
        assert (derender.choices[0].message.role, derender.choices[0].message.content) == ("narrator", "Hello,")
        chunks = list(client.stream(scripted(PROMPT, [9707, 11, 1879], output_mode="text")))
        assert "".join(c.choices[0].text for c in chunks) == "Hello, world"
        with pytest.raises(GenerateError) as err:
            client.generate({"token_ids": PROMPT, "output_mode": "text", "sampling_params": {"detokenize": False}})
        assert err.value.status == 400 and "detokenize" in err.value.message

    async def abort_one() -> list:
        async with AsyncClient(prod_server.url, api_key=KEYS[0]) as client:
            seen = []
            async for chunk in client.stream(scripted(PROMPT, [], request_id="metrics-abort", sampling_params=LONG)):
                seen.append(chunk)
                if len(seen) == 2:
                    await client.abort(["metrics-abort"])
            return seen

    seen = asyncio.run(abort_one())
    assert seen[-1].choices[0].finish_reason == "abort"

    def requests(mode: str, status: str) -> float:
        return _metric(http, "decode_server_requests_total", output_mode=mode, status=status)

    assert requests("text", "200") >= 2 and requests("derender", "200") >= 1 and requests("text", "400") >= 1
    assert _metric(http, "decode_server_time_to_first_token_seconds_count") >= 4
    # The aborted stream's second chunk brought tokens (the abort went out after it): one sample at least.
    assert _metric(http, "decode_server_inter_token_latency_seconds_count", output_mode="tokens") > 0
    assert _metric(http, "decode_server_aborts_total", cause="abort_endpoint") >= 1
    assert _metric(http, "decode_server_rejections_total", reason="detokenize_false") >= 1
    assert _metric(http, "decode_server_frontend_cpu_seconds") > 0
    assert _metric(http, "decode_server_requests_in_flight") == 0
    assert _metric(http, "vllm:generation_tokens_total", model_name="demo") > 0
    assert _metric(http, "vllm:request_success_total", finished_reason="stop") > 0


def test_one_json_access_line_per_request(prod_server, http):
    r = http.post(
        GENERATE,
        json=scripted(PROMPT, [9707], output_mode="text"),
        headers={**auth(), "X-Request-Id": "access-line-1"},
    )
    assert r.status_code == 200, r.text

    def access_lines() -> list[dict]:
        complete = prod_server.log_path.read_text().split("\n")[:-1]  # not a line still being written
        return [e for e in map(json.loads, complete) if e.get("request_id") == "access-line-1"]

    # The log reaches the file after the answer: through the server's stdio relay (its own thread).
    deadline = time.monotonic() + 10
    while not access_lines() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a second line for the same request would come as soon
    access = access_lines()
    assert len(access) == 1, access
    entry = access[0]
    assert entry["logger"] == "decode_server.access"
    assert entry["output_mode"] == "text" and entry["status"] == 200
    assert entry["prompt_tokens"] == 2 and entry["output_tokens"] == 2
    assert entry["ttft_ms"] is not None and entry["duration_ms"] >= entry["ttft_ms"]


def test_prompt_token_details_and_token_id_logprobs(http):
    body = scripted(PROMPT, [11, 12], output_mode="text", sampling_params={"logprobs": 1})
    r = http.post(GENERATE, json=body, headers=auth())
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out["usage"]["prompt_tokens_details"]["cached_tokens"], int)
    content = out["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content[:2]] == ["token_id:11", "token_id:12"]
    assert content[0]["bytes"] is None


def test_keep_alive_comments_and_the_load_endpoint_during_a_stream(http):
    body = scripted(PROMPT, [], request_id="kept-alive", sampling_params=LONG, stream=True)
    with http.stream("POST", GENERATE, json=body, headers=auth()) as r:
        lines = r.iter_lines()
        if ": keep-alive" not in lines:  # reads up to the first comment line
            pytest.fail("the stream ended without a `: keep-alive` comment line")
        # Read no further: the stream is open (its tokens take far longer than the first second).
        assert http.get("/load").json()["server_load"] >= 1
        http.post("/abort_requests", json={"request_ids": ["kept-alive"]}, headers=auth())
        assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
    assert http.get("/load").json() == {"server_load": 0}


def test_cors_middleware_role_and_a_flag_without_meaning(prod_server, http):
    preflight = http.options(
        GENERATE,
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ORIGIN
    body = scripted(PROMPT, [9707], output_mode="derender", parse_context=NO_THINKING, stream=True)
    with http.stream("POST", GENERATE, json=body, headers=auth(KEYS[1])) as r:
        assert r.headers["x-operator-middleware"] == "seen"
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[0]["choices"][0]["delta"] == {"role": "narrator", "content": ""}
    assert "--max-log-len has no meaning for decode-server" in prod_server.log_path.read_text()


def test_vllms_queue_limit_is_a_503_with_retry_after_and_no_stack_trace(prod_server, http):
    # vLLM counts each of a request's n sequences against --max-num-queued-reqs.
    body = scripted(PROMPT, [11], sampling_params={"n": QUEUE_LIMIT + 1})
    r = http.post(GENERATE, json=body, headers=auth())
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    error = r.json()["error"]
    assert error["code"] == 503 and "busy" in error["message"], "vLLM's own QueueOverflowError message"
    assert http.post(GENERATE, json=scripted(PROMPT, [11], sampling_params={"n": QUEUE_LIMIT}),
                      headers=auth()).status_code == 200
    assert "Traceback" not in prod_server.log_tail(200_000)


# ------------------------------------------------------------------ its end (these two run last)


def _output(reader: StreamReader) -> list[int] | str:
    events = reader.payloads()
    mode = reader.body["output_mode"]
    if mode == "tokens":
        return joined_tokens(events)
    if mode == "text":
        return joined_text(events)
    return "".join(c["delta"].get("content") or "" for c in choice_chunks(events))


def _engine_panels() -> list[Query]:
    """The dashboard's queries on vLLM's own series that any engine has (not the KV connector's)."""
    return [
        q for q in dashboard_queries(load_dashboard())
        if all(s.name.startswith("vllm:") and "nixl" not in s.name and "kv_fetch" not in s.name for s in selectors(q.promql))
    ]


def _connected(server, closing: contextlib.ExitStack) -> httpx.Client:
    client = httpx.Client(base_url=server.url, headers=auth(), timeout=120)
    closing.callback(client.close)
    assert client.get("/health").status_code == 200  # its connection open, kept alive for the stream
    return client


def test_sigterm_to_the_process_group_drains_every_stream_then_exits_zero(prod_server, tokenizer, tmp_path):
    """The drain with vLLM's engine core behind it, signalled as Ctrl+C, `kill -TERM -- -PGID` or an
    init wrapper does: to the server's whole process group. The engine cores lead sessions of their
    own (decode_server/process/engine_session.py), so the group's SIGTERM reaches only the server,
    which drains: DRAIN_STREAMS open streams of every mode end with "stop" and their full output; one
    more, endless, keeps the drain open (the process still runs once they are done) until it is
    aborted; then exit 0 when the last stream ended, not at the deadline, and no process left. A real
    Prometheus scrapes it: the dashboard's engine panels have data, and decode_server_draining 1 is
    scraped mid-drain (the server still answers scrapes while it drains).

    What is left at the deadline ends with "abort": tests/app/process/test_drain.py (in process),
    tests/engine/test_drain.py (a real process over the scripted engine), and on a real engine
    tests/engine/test_scale_out.py."""
    prom = Prometheus(tmp_path, prod_server.url.removeprefix("http://"))
    clients = contextlib.ExitStack()
    try:
        cores = detached_engine_cores(prod_server)
        everyone = psutil.Process(prod_server.proc.pid).children(recursive=True)
        warm = httpx.post(prod_server.url + GENERATE, json=body_for("tokens", DRAIN_SCRIPT[:8]), headers=auth(), timeout=120)
        assert warm.status_code == 200, warm.text
        panels = _engine_panels()
        prom.until(lambda: all(prom.query(q.promql) for q in panels), f"data for {[q.where for q in panels]}")
        # A client each, connected before any stream starts, so that only the requests go out
        # between them (with a client built between each, one run's second stream reached the
        # server 3.7 s after the first, which had run 250 of its 256 tokens alone by then).
        held_client, *stream_clients = [_connected(prod_server, clients) for _ in range(DRAIN_STREAMS + 1)]
        # First, so the others' start does not delay its first event.
        held = StreamReader(held_client, body_for("tokens", [], request_id="drain-held", sampling_params=LONG))
        held.wait_events(1)
        readers = [
            StreamReader(client, body_for(MODES[i % len(MODES)], DRAIN_SCRIPT, request_id=f"drain-{i}"))
            for i, client in enumerate(stream_clients)
        ]
        for reader in readers:
            reader.wait_events(1)
        lead = max(len(r.events) for r in readers)
        assert not any(r.done() for r in readers), "every stream is open when the signal comes"
        started = time.monotonic()
        os.killpg(prod_server.proc.pid, signal.SIGTERM)
        prom.until(lambda: prom.query('decode_server_draining{job="decode-server"} == 1'), "scraping the drain")
        for reader in readers:
            reader.join(DRAIN_WINDOW_S + 30)
        assert prod_server.proc.poll() is None and not held.done(), (
            f"the drain lasts while a request is in flight; the held one ended {finish_reason(held.payloads())!r} "
            f"{time.monotonic() - started:.0f} s after the signal (at the deadline: the streams were slower than the window)"
        )
        aborted = httpx.post(prod_server.url + "/abort_requests", json={"request_ids": ["drain-held"]}, headers=auth(), timeout=10)
        assert aborted.status_code == 200, aborted.text
        held.join(30)
        code = prod_server.proc.wait(60)
        elapsed = time.monotonic() - started
        alive = wait_ended([*everyone, *cores], 30)
    finally:
        clients.close()
        prom.close()
    ends = [(r.body["output_mode"], finish_reason(r.payloads()), r.payloads()[-1:]) for r in readers]
    assert ends == [(MODES[i % len(MODES)], "stop", ["[DONE]"]) for i in range(DRAIN_STREAMS)], prod_server.log_tail()
    text = tokenizer.decode(DRAIN_SCRIPT)
    expected = {"tokens": DRAIN_SCRIPT + [IM_END], "text": text, "derender": text}
    assert [_output(r) for r in readers] == [expected[MODES[i % len(MODES)]] for i in range(DRAIN_STREAMS)]
    assert (finish_reason(held.payloads()), held.payloads()[-1]) == ("abort", "[DONE]")
    assert code == 0, prod_server.log_tail()
    assert elapsed < DRAIN_WINDOW_S, f"{elapsed:.1f} s: the drain ended when the streams did, not at the deadline"
    assert not alive, f"outlived the server: {alive}"
    print(f"{DRAIN_STREAMS} streams drained; exit 0 after {elapsed:.1f} s; when the last stream's first event came, "
          f"the furthest had {lead} events (its script: {len(DRAIN_SCRIPT)} tokens)")


def test_every_log_record_from_start_to_exit_is_one_json_object(prod_server):
    """`--log-format json`: every line the server wrote, vLLM's own loggers in the API process and
    in the engine core included, and the lines that bypass logging (the import-time Triton notice
    in spawned processes, libtorch's NUMA warning: decode_server/process/stdio_json.py), through
    the drain to its exit."""
    assert prod_server.stop() == 0, "the drain above ends the server; its exit code"
    not_json, entries = [], []
    for line in prod_server.log_path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            entry = None
        if isinstance(entry, dict):
            entries.append(entry)
        else:
            not_json.append(line)
    assert not not_json, "lines that are not one JSON object:\n" + "\n".join(not_json[:20])
    assert all({"ts", "level", "logger", "process", "pid"} <= set(e) for e in entries)
    loggers = {e["logger"] for e in entries}
    assert any(name.startswith("vllm.") for name in loggers), loggers
    assert {"decode_server.access", "decode_server.process.server"} <= loggers, loggers
    # The engine core's own lines (another process, configured by vLLM from the same file).
    assert any(e["process"].startswith("EngineCore") for e in entries), {e["process"] for e in entries}
