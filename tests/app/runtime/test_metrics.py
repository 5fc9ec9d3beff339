"""Our series' labels and the operator's series issue 24 asks for, in process: `model_name` on every
`decode_server_*` sample (the served model name, as vLLM labels its own), the drain gauge, and the
decode legs' remote-prefill outcomes (ok, timeout, failed) on a KV-connector engine."""

from __future__ import annotations

import json

import pytest

from tests.support.inprocess import body_for, error_of, serve
from tests.support.servers import PARSER_FLAGS
from tests.support import GENERATE

pytestmark = pytest.mark.anyio

NIXL = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
DECODE_LEG = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "p0", "remote_host": "10.0.0.9",
              "remote_port": 5600, "remote_block_ids": [1]}


def samples(text: str, prefix: str) -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of every sample on a /metrics page whose name starts with `prefix`."""
    out = []
    for line in text.splitlines():
        if line.startswith(prefix):
            series = line.rsplit(" ", 1)[0]
            name, _, rest = series.partition("{")
            labels = dict(pair.split("=", 1) for pair in rest.rstrip("}").split(",") if pair)
            out.append((name, {k: v.strip('"') for k, v in labels.items()}))
    return out


async def test_every_decode_server_series_carries_the_served_model_name_as_vllms_do(demo_model):
    async with serve(demo_model, *PARSER_FLAGS, "--served-model-name", "pool-model", "alias") as s:
        ok = await s.client.post(GENERATE, json=body_for("text", [9707, 11]))
        bad = await s.client.post(GENERATE, content=b"not json")
        assert ok.status_code == 200 and error_of(bad)[1].startswith("request body is not valid JSON"), (ok.text, bad.text)
        await s.events(body_for("tokens", [9707, 11, 1879]))
        text = (await s.client.get("/metrics")).text
    ours = samples(text, "decode_server_")
    names = {name for name, _ in ours}
    # Every family, its labelled children included (requests, TTFT, ITL, rejections, in flight).
    assert {"decode_server_requests_total", "decode_server_time_to_first_token_seconds_bucket",
            "decode_server_inter_token_latency_seconds_count", "decode_server_rejections_total",
            "decode_server_requests_in_flight", "decode_server_draining", "decode_server_live_request_states"} <= names, names
    unlabelled = [(n, l) for n, l in ours if l.get("model_name") != "pool-model"]
    assert not unlabelled, unlabelled
    # vLLM's own series name the model the same way (the first served name), so the two join.
    vllm_models = {l.get("model_name") for n, l in samples(text, "vllm:") if "model_name" in l}
    assert vllm_models == {"pool-model"}, vllm_models


async def test_the_draining_gauge_is_one_from_the_drain_on(demo_model):
    async with serve(demo_model, *PARSER_FLAGS) as s:
        assert await s.metric("decode_server_draining") == 0
        s.lifecycle.begin_drain()
        assert await s.metric("decode_server_draining") == 1
        r = await s.client.post(GENERATE, json=body_for("tokens", [9707]))
        assert error_of(r)[:2] == (503, "the server is draining (shutting down); retry on another replica"), r.text


async def test_remote_prefill_outcomes_are_counted(demo_model, monkeypatch):
    monkeypatch.setenv("DECODE_SERVER_REMOTE_PREFILL_TIMEOUT_S", "0.3")
    async with serve(demo_model, *PARSER_FLAGS, "--kv-transfer-config", NIXL) as s:
        def leg(request_id: str, **fields):
            return body_for("tokens", [9707, 11], request_id=request_id, kv_transfer_params=DECODE_LEG, **fields)

        ok = await s.client.post(GENERATE, json=leg("ok"))
        assert ok.status_code == 200, ok.text
        s.core.fail("failed", after_tokens=0)  # vLLM's failed KV load: finish reason "error", no token
        failed = await s.client.post(GENERATE, json=leg("failed"))
        status, message, param = error_of(failed)
        assert (status, param) == (502, "kv_transfer_params") and message.startswith("remote prefill failed"), failed.text
        gate = s.core.hold("stalled")  # no first token: the transfer never completes
        stalled = await s.client.post(GENERATE, json=leg("stalled"))
        status, message, param = error_of(stalled)
        assert (status, param) == (504, "kv_transfer_params") and message.startswith("remote prefill timed out"), stalled.text
        gate.release()
        # A plain request on the same engine is no decode leg.
        plain = await s.client.post(GENERATE, json=body_for("tokens", [9707], request_id="plain"))
        assert plain.status_code == 200, plain.text
        counts = {o: await s.metric("decode_server_remote_prefill_total", outcome=o) for o in ("ok", "timeout", "failed")}
        assert counts == {"ok": 1, "timeout": 1, "failed": 1}, counts
        assert await s.metric("decode_server_rejections_total", reason="remote_prefill_timeout") == 1
