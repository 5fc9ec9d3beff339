"""llm-d's own legs against the real P/D pair (tests/engine/pd/conftest.py's pd_pair): each caller
request through the legs llm-d-router v0.10.0's sidecar and coordinator build (tests/support/llmd_legs.py),
sent as the router's bytes to the --tokens-only prefill pool and then to the decode pool, decodes as one
instance would. Runs before test_pd_faults.py, whose last tests kill instances."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.support import llmd_legs
from tests.support.pd_pair import metrics as _metrics
from tests.support.pd_pair import salt as _salt
from tests.support.chat_cases import WEATHER, chat_prompt, accumulate, call, parse_context, without_ids
from tests.support import GENERATE, choice_chunks, finish_reason, joined_tokens, scripted

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(900)]


# ----------------------------------------------------------------- llm-d's own legs, replayed

_LLM_D_TEXT = "<think>\nShort answer.\n</think>\n\nSunny, 21 degrees."


def _llm_d_callers(tokenizer) -> dict[str, dict[str, Any]]:
    """What a caller sends through llm-d, one request per level: tokens, text, a stop string,
    a derender stream (tool call, stop string, stream_options) and structured outputs."""
    prompt = chat_prompt(tokenizer, [])
    script = tokenizer.encode(_LLM_D_TEXT, add_special_tokens=False)
    tool_script = tokenizer.encode(
        "<think>\nThe user wants the weather.\n</think>\n\n" + call("get_weather", {"city": "Paris"}),
        add_special_tokens=False,
    )
    return {
        "tokens": scripted(prompt, script, sampling_params={"max_tokens": 32, "logprobs": 1}),
        "text": scripted(prompt, script, output_mode="text", sampling_params={"max_tokens": 32, "min_tokens": 2, "logprobs": 1}),
        "stop": scripted(prompt, script, output_mode="text", sampling_params={"max_tokens": 32, "stop": ["21"]}),
        "derender": scripted(
            chat_prompt(tokenizer, [WEATHER]),
            tool_script,
            output_mode="derender",
            stream=True,
            stream_options={"include_usage": True},
            parse_context=parse_context({"tools": [WEATHER]}),
            sampling_params={"max_tokens": 64, "skip_special_tokens": False, "stop": ["never-in-the-output"]},
        ),
        "structured": {
            "token_ids": list(range(8000, 8030)),
            "output_mode": "text",
            "reasoning_ended": True,
            "sampling_params": {"max_tokens": 8, "temperature": 0, "structured_outputs": {"choice": ["sunny", "rainy"]}},
        },
    }


def _post_leg(url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    """POST a leg's bytes as the router writes them: the batch JSON, or a stream's data payloads."""
    headers = {"content-type": "application/json", **headers}
    content = llmd_legs.go_json(body)
    if not body.get("stream"):
        r = httpx.post(url + GENERATE, content=content, headers=headers, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()
    events: list[Any] = []
    with httpx.stream("POST", url + GENERATE, content=content, headers=headers, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return events


def _outcome(answer: Any) -> tuple[Any, list[float]]:
    """What the client reads, less per-request names (ids, `created`) and with the sampled tokens'
    logprobs apart (the decode engine computes the last prompt position alone: float noise)."""
    if isinstance(answer, list):
        chunks = choice_chunks(answer)
        message = without_ids(accumulate([c["delta"] for c in chunks]))
        return (joined_tokens(answer), message, finish_reason(answer), answer[-2]["usage"], answer[-1]), []
    body = {k: v for k, v in answer.items() if k not in ("request_id", "created")}
    body["choices"] = [dict(c) for c in body["choices"]]
    logprobs: list[float] = []
    for choice in body["choices"]:
        content = (choice.pop("logprobs", None) or {}).get("content") or []
        choice["sampled"] = [t.get("token_id", t.get("token")) for t in content]
        logprobs += [t["logprob"] for t in content]
    return body, logprobs


def _check_level(name: str, outcome: Any, script_text: str) -> None:
    """Each case really exercised its level (the equality with one instance is checked apart)."""
    if name == "derender":
        tokens, message, finish, _usage, done = outcome
        assert message["reasoning"] and message["tool_calls"][0]["name"] == "get_weather"
        assert (finish, done) == ("tool_calls", "[DONE]")
        return
    choice = outcome["choices"][0]
    assert outcome["output_mode"] == ("tokens" if name == "tokens" else "text")
    if name == "text":
        assert choice["text"] == script_text and choice["finish_reason"] == "stop"
    elif name == "stop":
        assert choice["text"] == script_text.split("21")[0] and choice["stop_reason"] == "21"
    elif name == "structured":
        assert choice["text"] in ("sunny", "rainy")
    else:
        assert len(choice["token_ids"]) > 10 and len(choice["sampled"]) == len(choice["token_ids"])


@pytest.mark.parametrize("router", ["sidecar", "coordinator"])
def test_llm_d_legs_against_the_tokens_only_prefill_pool_decode_as_one_instance(pd_pair, tokenizer, router):
    """Each caller request through the legs llm-d-router v0.10.0 builds (tests/support/llmd_legs.py, from
    its source: the sidecar forwards `output_mode`, `stop`, `structured_outputs`, `parse_context`
    and the caller's headers to the prefill pod; the coordinator puts the KV params in
    `sampling_params.extra_args`), sent as the router's bytes to the --tokens-only prefill pool and
    the decode pool: every prefill leg is a 200 tokens-level prefill with the producer's KV params,
    every decode leg answers what one decode instance answers alone, decoded from the pulled KV."""
    fingerprint = httpx.get(pd_pair.decode.url + "/v1/models", timeout=30).json()["data"][0]["parser_fingerprint"]
    p2p = 'vllm:prompt_tokens_cached_by_source_total{source="p2p"}'
    before, pulled = _metrics(pd_pair.decode.url), 0
    for name, request in _llm_d_callers(tokenizer).items():
        caller = {**request, "cache_salt": _salt()}
        rid = llmd_legs.sidecar_request_id() if router == "sidecar" else f"coordinator-{time.monotonic_ns()}"
        # Both routers pass the caller's headers on (here pinned to the decode pool's fingerprint).
        headers = {"x-parser-fingerprint": fingerprint, "x-request-id": rid}
        if router == "sidecar":
            prefill_leg = llmd_legs.sidecar_prefill_leg(caller)
        else:
            prefill_leg = llmd_legs.coordinator_prefill_leg(caller, rid)
        answer = _post_leg(pd_pair.prefill.url, prefill_leg, headers)
        kv = answer["kv_transfer_params"]
        assert kv["do_remote_prefill"] is True and kv["remote_block_ids"], name
        assert answer["output_mode"] == "tokens" and len(answer["choices"][0]["token_ids"]) == 1, name
        assert f"request_id={rid} output_mode=tokens status=200" in pd_pair.prefill.log_tail(20000), name
        build = llmd_legs.sidecar_decode_leg if router == "sidecar" else llmd_legs.coordinator_decode_leg
        ours, ours_logprobs = _outcome(_post_leg(pd_pair.decode.url, build(caller, answer), headers))
        single, single_logprobs = _outcome(
            _post_leg(pd_pair.decode.url, {**request, "cache_salt": _salt()}, {"x-parser-fingerprint": fingerprint})
        )
        assert ours == single, name
        assert ours_logprobs == pytest.approx(single_logprobs, abs=0.05), name
        _check_level(name, ours, _LLM_D_TEXT)
        pulled += len(request["token_ids"])
    after = _metrics(pd_pair.decode.url)
    assert after[p2p] - before[p2p] == pulled, "every decode leg loaded its whole prompt from the prefill pool"
    assert after["vllm:nixl_num_failed_transfers_total"] == 0
