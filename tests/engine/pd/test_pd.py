"""Prefill/decode disaggregation for real: two decode-server instances with vLLM's NixlConnector.

A prefill instance (`--tokens-only`, `kv_producer`) and a decode instance (tokenizer, qwen3 +
hermes parsers, `kv_consumer`) on loopback, with the KV cache in host memory
(`kv_buffer_device: cpu`) and NIXL's UCX backend (over TCP) moving it: two of the set of engines
this module shares with tests/engine/pd/test_pd_faults.py (tests/support/pd_pair.py); requests go through
`protocol.clients.pd` (the legs llm-d's NIXL v2 routing sidecar builds, less the decode-only fields) and
`decode-server pd-proxy`, and as llm-d-router's sidecar and coordinator send them, byte for byte
(`tests/support/llmd_legs.py`).

The model is the demo model with **real, seeded random weights** (written once into a copy of
the demo model dir and loaded as safetensors, not `--load-format dummy`): dummy weights give
near-identical output for any prompt, so they could not show that decode used the transferred
KV. With these weights the next token depends on the whole prompt.

Two machine-level settings keep the pair fast on a small CPU box:

- each engine's OpenMP thread is pinned to its own core (`VLLM_CPU_OMP_THREADS_BIND`);
- NIXL's UCX progress thread busy-polls a core per engine: nixl 1.5.1's Python agent hard-codes
  `pthrDelay = 0`, the timeout of the thread's `poll()` on the UCX workers' event fds, and
  neither vLLM nor NIXL reads a setting for it. A `sitecustomize` on the set's servers'
  PYTHONPATH sets it to 1 ms when `nixl_cu12._api` / `nixl_cu13._api` load (the thread still
  wakes on UCX events at once; the timeout is NIXL's fallback wake-up), so an idle engine
  costs ~1% of a core instead of 100%.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import httpx
import pytest

from protocol.clients.generate import Client
from protocol.clients.pd import AsyncPDClient, PDClient, decode_request, prefill_request
from tests.support import servers
from tests.support.pd_pair import LEASE_S
from tests.support.pd_pair import kv_usage as _kv_usage
from tests.support.pd_pair import metrics as _metrics
from tests.support.pd_pair import salt as _salt
from tests.support.chat_cases import WEATHER, chat_prompt, accumulate, call, parse_context, without_ids
from tests.support import GENERATE, choice_chunks, finish_reason, joined_tokens, scripted

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(900)]


# ----------------------------------------------------------------- helpers


def _first_token(url: str, token_ids: list[int], kv_transfer_params: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "token_ids": token_ids,
        "cache_salt": _salt(),
        "sampling_params": {"max_tokens": 1, "temperature": 0, "logprobs": 2},
    }
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    r = httpx.post(url + GENERATE, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["content"][0]


# ----------------------------------------------------------------- against the real pair


def test_prefill_leg_returns_the_producers_kv_transfer_params(pd_pair):
    body = prefill_request({"token_ids": list(range(1000, 1040)), "cache_salt": _salt()})
    r = httpx.post(pd_pair.prefill.url + GENERATE, json=body, timeout=60)
    assert r.status_code == 200, r.text
    kv = r.json()["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_host"] == "127.0.0.1" and isinstance(kv["remote_port"], int)
    assert kv["remote_engine_id"] and kv["remote_block_ids"] and kv["remote_num_tokens"] == 40
    # Pull it, so the producer frees the blocks now rather than at the lease timeout.
    with Client(pd_pair.decode.url) as c:
        c.generate({"token_ids": body["token_ids"], "cache_salt": body["cache_salt"], "kv_transfer_params": kv,
                    "sampling_params": {"max_tokens": 1}})
    # A drifted parser fingerprint is refused at the prefill pool too (the rules: tests/app/runtime/test_kv_transfer.py).
    # (A prefill leg itself is answered whatever the fingerprint: its answer reaches no client.)
    r = httpx.post(
        pd_pair.prefill.url + GENERATE, json={"token_ids": [9707]}, headers={"x-parser-fingerprint": "0" * 16}, timeout=60
    )
    assert r.status_code == 409 and "fingerprint" in r.json()["error"]["message"], r.text


def test_derender_stream_through_the_proxy_equals_one_instance(pd_pair, tokenizer):
    script = tokenizer.encode(
        "<think>\nThe user wants the weather.\n</think>\n\n" + call("get_weather", {"city": "Paris"}),
        add_special_tokens=False,
    )
    chat = {"tools": [WEATHER]}
    request = scripted(
        chat_prompt(tokenizer, [WEATHER]),
        script,
        output_mode="derender",
        parse_context=parse_context(chat),
        stream_options={"include_usage": True},
        sampling_params={"max_tokens": 64, "skip_special_tokens": False, "stop": ["never-in-the-output"]},
    )
    before = _metrics(pd_pair.decode.url)

    def run(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[Any]:
        events: list[Any] = []
        with httpx.stream("POST", url + GENERATE, json={**body, "stream": True}, headers=headers, timeout=120) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
        return events

    single = run(pd_pair.decode.url, {**request, "cache_salt": _salt()})
    rid = f"pd-derender-{time.monotonic_ns()}"
    via_proxy = run(pd_pair.proxy.url, {**request, "cache_salt": _salt()}, headers={"X-Request-Id": rid})
    after = _metrics(pd_pair.decode.url)

    def message(events: list[Any]) -> dict[str, Any]:
        return without_ids(accumulate([c["delta"] for c in choice_chunks(events)]))

    assert message(via_proxy) == message(single)
    assert message(single)["reasoning"] and message(single)["tool_calls"][0]["name"] == "get_weather"
    assert joined_tokens(via_proxy) == joined_tokens(single) == [*script, 151645]
    assert finish_reason(via_proxy) == finish_reason(single) == "tool_calls"
    assert via_proxy[-1] == "[DONE]" and via_proxy[-2]["usage"] == single[-2]["usage"]
    assert all(e["output_mode"] == "derender" and e["request_id"] == f"generate-tokens-{rid}" for e in via_proxy if isinstance(e, dict))
    # Both legs ran under the caller's request id (the prefill one as a tokens-level request).
    assert f"request_id={rid} output_mode=tokens status=200" in pd_pair.prefill.log_tail(20000)
    # ... and the proxied one really was decoded from the prefill pool's KV.
    p2p = 'vllm:prompt_tokens_cached_by_source_total{source="p2p"}'
    assert after[p2p] - before[p2p] == len(request["token_ids"])


def test_every_output_level_decodes_from_transferred_kv(pd_pair, tokenizer):
    """Batch tokens/text/derender through PDClient (sync) and a text stream through AsyncPDClient."""
    prompt = chat_prompt(tokenizer, [])
    text = "<think>\nShort answer.\n</think>\n\nSunny, 21 degrees."
    script = tokenizer.encode(text, add_special_tokens=False)
    p2p = 'vllm:prompt_tokens_cached_by_source_total{source="p2p"}'
    before = _metrics(pd_pair.decode.url)
    with PDClient(pd_pair.prefill.url, pd_pair.decode.url) as pd, Client(pd_pair.decode.url) as one:
        for mode in ("tokens", "text", "derender"):
            fields: dict[str, Any] = {"output_mode": mode, "sampling_params": {"max_tokens": 32, "logprobs": 1}}
            if mode == "derender":
                fields["parse_context"] = {}
            ours = pd.generate(scripted(prompt, script, cache_salt=_salt(), **fields))
            ref = one.generate(scripted(prompt, script, cache_salt=_salt(), **fields))
            assert pd.last_kv_transfer_params["do_remote_prefill"] is True
            assert ours.choices[0].token_ids == ref.choices[0].token_ids == [*script, 151645], mode
            assert ours.usage == ref.usage
            assert ours.kv_transfer_params is None  # a consumer hands nothing on
            if mode == "text":
                assert ours.choices[0].text == ref.choices[0].text == text
            if mode == "derender":
                assert ours.choices[0].message == ref.choices[0].message
                assert ours.choices[0].message.content.strip() == "Sunny, 21 degrees."

    async def async_stream() -> str:
        async with AsyncPDClient(pd_pair.prefill.url, pd_pair.decode.url) as pd:
            chunks = [c async for c in pd.stream(scripted(prompt, script, output_mode="text", cache_salt=_salt()))]
        return "".join(c.choices[0].text for c in chunks if c.choices)

    assert asyncio.run(async_stream()) == text
    after = _metrics(pd_pair.decode.url)
    assert after[p2p] - before[p2p] == 4 * len(prompt)


def test_structured_output_requests_go_through(pd_pair):
    """A tokens-only prefill pool refuses structured outputs; the prefill leg drops them, the decode leg applies them."""
    body = {
        "token_ids": list(range(8000, 8030)),
        "output_mode": "text",
        # The decode server has a reasoning parser: the grammar applies once reasoning has ended.
        "reasoning_ended": True,
        "sampling_params": {"max_tokens": 8, "temperature": 0, "structured_outputs": {"choice": ["sunny", "rainy"]}},
    }
    r = httpx.post(pd_pair.prefill.url + GENERATE, json={**body, "output_mode": "tokens"}, timeout=60)
    assert r.status_code == 400 and "requires a tokenizer" in r.json()["error"]["message"]
    with PDClient(pd_pair.prefill.url, pd_pair.decode.url) as pd, Client(pd_pair.decode.url) as one:
        ours = pd.generate({**body, "cache_salt": _salt()})
        assert pd.last_kv_transfer_params["do_remote_prefill"] is True
        ref = one.generate({**body, "cache_salt": _salt()})
    assert ours.choices[0].text == ref.choices[0].text
    assert ours.choices[0].text in ("sunny", "rainy")


# ----------------------------------------------------------------- the transfer, metrics, faults through the proxy


def test_decode_uses_the_transferred_kv_not_its_own_prompt(pd_pair):
    """Decode prompt B with prompt A's transferred KV: the first token is A's, not B's.

    A and B have the same length and last token, and differ everywhere else. The decode
    engine loads all of B's positions but the last from the prefill pool and computes only
    the last one itself, so with A's blocks it computes exactly A's next token.
    """
    rnd = random.Random(7)
    for _attempt in range(6):
        a_ids = [rnd.randrange(1000, 100_000) for _ in range(47)] + [1273]
        b_ids = [rnd.randrange(1000, 100_000) for _ in range(47)] + [1273]
        a, b = _first_token(pd_pair.decode.url, a_ids), _first_token(pd_pair.decode.url, b_ids)
        margin = min(t["logprob"] for t in (a, b)) - max(
            t["top_logprobs"][1]["logprob"] for t in (a, b)
        )
        if a["token_id"] != b["token_id"] and margin > 0.1:
            break
    else:
        pytest.fail("no prompt pair with distinct first tokens and a clear argmax margin")
    with PDClient(pd_pair.prefill.url, pd_pair.decode.url) as pd:
        kv_a = pd.prefill({"token_ids": a_ids, "cache_salt": _salt()})
        kv_b = pd.prefill({"token_ids": b_ids, "cache_salt": _salt()})
    swapped = _first_token(pd_pair.decode.url, b_ids, kv_a)
    own = _first_token(pd_pair.decode.url, b_ids, kv_b)
    assert swapped["token_id"] == a["token_id"] != b["token_id"]
    assert swapped["logprob"] == pytest.approx(a["logprob"], abs=0.05)
    assert own["token_id"] == b["token_id"]
    assert own["logprob"] == pytest.approx(b["logprob"], abs=0.05)


def test_decode_metrics_show_the_p2p_transfer(pd_pair):
    prompt = list(range(2000, 2300))  # 300 tokens: more than one KV block
    before = _metrics(pd_pair.decode.url)
    with PDClient(pd_pair.prefill.url, pd_pair.decode.url) as pd:
        r = pd.generate({"token_ids": prompt, "cache_salt": _salt(), "sampling_params": {"max_tokens": 4}})
    after = _metrics(pd_pair.decode.url)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert len(r.choices[0].token_ids) == 4
    assert delta('vllm:prompt_tokens_cached_by_source_total{source="p2p"}') == len(prompt)
    assert delta('vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}') == len(prompt)
    assert delta("vllm:nixl_xfer_time_seconds_count") >= 1
    assert delta("vllm:nixl_bytes_transferred_sum") > 0
    assert after["vllm:nixl_num_failed_transfers_total"] == 0
    assert after["vllm:nixl_num_failed_notifications_total"] == 0
    # The usage block does not show it (vLLM counts p2p hits only in its metrics).
    assert r.usage.prompt_tokens == len(prompt)


def test_a_failing_prefill_leg_surfaces_through_the_proxy(pd_pair):
    r = httpx.post(pd_pair.proxy.url + GENERATE, json={"token_ids": [1, 2, 10**7], "output_mode": "text"}, timeout=60)
    assert r.status_code == 400
    assert r.headers["x-pd-failed-leg"] == "prefill"
    assert "out of the model's vocabulary" in r.json()["error"]["message"]
    r = httpx.post(pd_pair.proxy.url + GENERATE, json={"token_ids": "nope"}, timeout=60)
    assert r.status_code == 400 and "x-pd-failed-leg" not in r.headers


def test_closing_a_proxied_stream_aborts_the_decode_leg(pd_pair):
    name = 'decode_server_aborts_total{cause="client_disconnect"}'
    before = _metrics(pd_pair.decode.url).get(name, 0.0)
    body = {
        "token_ids": list(range(7000, 7064)),
        "stream": True,
        "cache_salt": _salt(),
        "sampling_params": {"max_tokens": 3000, "ignore_eos": True},
    }
    with httpx.stream("POST", pd_pair.proxy.url + GENERATE, json=body, timeout=120) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["token_ids"]
    # Closing the client's stream closes the proxy's decode leg: the decode server aborts it.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = _metrics(pd_pair.decode.url)
        if m.get(name, 0.0) > before and m["decode_server_live_request_states"] == 0:
            break
        time.sleep(0.25)
    assert m.get(name, 0.0) == before + 1
    assert m["decode_server_live_request_states"] == 0


def test_idle_pair_does_not_busy_poll(pd_pair):
    """With the progress-thread timeout set, an idle engine's processes use ~no CPU.

    (A prefill engine holding blocks for a decode leg that has not pulled them yet keeps
    stepping until they are released: wait for that first.)
    """
    import psutil

    deadline = time.monotonic() + LEASE_S + 15
    while _kv_usage(pd_pair.prefill.url) > 0 and time.monotonic() < deadline:
        time.sleep(0.25)
    time.sleep(1.0)

    def processes(server: servers.Server) -> list[Any]:
        root = psutil.Process(server.proc.pid)
        return [root, *root.children(recursive=True)]

    # Both servers over the same 2 s.
    procs = {server.name: processes(server) for server in (pd_pair.prefill, pd_pair.decode)}
    t0 = {p.pid: sum(p.cpu_times()[:2]) for ps in procs.values() for p in ps}
    time.sleep(2.0)
    for name, ps in procs.items():
        cores = {f"{p.name()}[{p.pid}]": (sum(p.cpu_times()[:2]) - t0[p.pid]) / 2.0 for p in ps}
        assert sum(cores.values()) < 0.3, f"{name} is busy while idle: {cores}"


def test_a_refused_decode_leg_frees_the_prefill_blocks_at_once(pd_pair):
    """"At once": before the prefill instance's lease (`LEASE_S`) runs out, and no request expired
    meanwhile. (The leg with its KV params in `extra_args`, as llm-d's coordinator sends it, and
    which refusals release: tests/app/runtime/test_kv_transfer.py.)"""
    prompt = list(range(5000, 6000))
    expired = "vllm:nixl_num_kv_expired_reqs_total"
    # A decode leg the decode server refuses (derender without parse_context on a parser-configured server).
    refused = {"token_ids": prompt, "output_mode": "derender"}
    with PDClient(pd_pair.prefill.url, pd_pair.decode.url) as pd:
        pd.generate({"token_ids": prompt[:10], "sampling_params": {"max_tokens": 1}})  # the NIXL handshake is done
        deadline = time.monotonic() + LEASE_S + 15
        while _kv_usage(pd_pair.prefill.url) > 0 and time.monotonic() < deadline:
            time.sleep(0.25)
        before = _metrics(pd_pair.prefill.url).get(expired, 0.0)
        leg = decode_request(refused, pd.prefill({"token_ids": prompt, "cache_salt": _salt()}))
    t_prefilled = time.monotonic()
    assert _kv_usage(pd_pair.prefill.url) > 0, "the producer holds the prompt's blocks for the decode leg"
    r = httpx.post(pd_pair.decode.url + GENERATE, json=leg, timeout=60)
    assert r.status_code == 400, r.text
    assert "needs parse_context" in r.json()["error"]["message"]
    while _kv_usage(pd_pair.prefill.url) > 0 and time.monotonic() < t_prefilled + LEASE_S - 1:
        time.sleep(0.1)
    assert _kv_usage(pd_pair.prefill.url) == 0, f"the prefill blocks are still held {LEASE_S - 1} s after the answer"
    assert _metrics(pd_pair.prefill.url).get(expired, 0.0) == before, "the lease freed them, not the refusal"
