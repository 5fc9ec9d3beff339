"""The P/D legs without an engine: what `protocol.clients.pd` and llm-d's sidecar and coordinator send
(tests/support/llmd_legs.py), and which of them our server answers as a tokens prefill
(decode_server/runtime/kv_transfer.py). The legs against real NIXL instances: tests/engine/pd/test_pd.py and test_pd_behind_llm_d.py."""

from __future__ import annotations

from typing import Any

from protocol.clients.pd import PREFILL_KV_TRANSFER_PARAMS, decode_request, prefill_request
from tests.support import llmd_legs, scripted


def test_leg_bodies_are_what_the_nixl_v2_sidecar_sends():
    caller = {
        "token_ids": [1, 2, 3],
        "request_id": "r1",
        "output_mode": "derender",
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_salt": "s",
        "parse_context": {"tools": []},
        "chat_request": None,
        "sampling_params": {
            "max_tokens": 50,
            "min_tokens": 5,
            "stop": ["x"],
            "structured_outputs": {"choice": ["a", "b"]},
            "temperature": 0.5,
            "extra_args": {"k": 1},
        },
    }
    p = prefill_request(caller)
    assert p == {
        "token_ids": [1, 2, 3],
        "request_id": "r1",
        "output_mode": "tokens",
        "stream": False,
        "cache_salt": "s",
        "sampling_params": {"max_tokens": 1, "min_tokens": 1, "temperature": 0.5, "extra_args": {"k": 1}},
        "kv_transfer_params": dict(PREFILL_KV_TRANSFER_PARAMS),
    }
    kv = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [[1]]}
    d = decode_request(caller, kv)
    assert d == {**caller, "kv_transfer_params": kv}
    assert caller["sampling_params"]["max_tokens"] == 50, "the caller's request is not mutated"


def _decoded(body: dict[str, Any]) -> Any:
    from protocol.decoding import decode_generate_request

    req, _ = decode_generate_request(llmd_legs.go_json(body))
    req.request_id = "r"
    return req


def test_only_an_unambiguous_prefill_leg_is_answered_as_a_tokens_prefill():
    """A prefill leg is `do_remote_decode: true` (top level or in extra_args) with max_tokens 1;
    only that drops the decode-only fields, and only those."""
    from decode_server.runtime.kv_transfer import as_tokens_prefill_leg, is_prefill_leg, kv_transfer_params_of

    caller = scripted(
        [1, 2, 3], [7], output_mode="derender", cache_salt="s", parse_context={"tools": []}, reasoning_ended=True,
        sampling_params={"max_tokens": 9, "logprobs": 2, "stop": ["x"], "structured_outputs": {"choice": ["a"]}},
    )
    sidecar = _decoded(llmd_legs.sidecar_prefill_leg(caller))
    coordinator = _decoded(llmd_legs.coordinator_prefill_leg(caller, "r"))
    assert is_prefill_leg(sidecar) and is_prefill_leg(coordinator)
    assert kv_transfer_params_of(coordinator) == llmd_legs.PREFILL_KV and coordinator.kv_transfer_params is None
    view = as_tokens_prefill_leg(sidecar)
    assert (view.output_mode, view.parse_context, view.chat_request) == ("tokens", None, None)
    assert view.sampling_params.provided() == {
        "max_tokens": 1, "min_tokens": 1, "logprobs": 2, "extra_args": {"replay_token_ids": [7]}
    }
    assert (view.kv_transfer_params, view.cache_salt, view.reasoning_ended) == (llmd_legs.PREFILL_KV, "s", True)
    assert sidecar.output_mode == "derender", "the request itself is not changed"
    not_legs = [
        {**caller, "kv_transfer_params": llmd_legs.PREFILL_KV},  # max_tokens 9: the answer is the client's
        {**caller, "sampling_params": {"max_tokens": 1}},  # no KV params
        {**caller, "sampling_params": {"max_tokens": 1}, "kv_transfer_params": {"do_remote_decode": False}},
        {**caller, "sampling_params": {"max_tokens": 1}, "kv_transfer_params": {"do_remote_decode": "true"}},
        # The top level wins over extra_args, as in vLLM: here it says "no remote decode".
        {**llmd_legs.coordinator_prefill_leg(caller, "r"), "kv_transfer_params": {}},
    ]
    assert not any(is_prefill_leg(_decoded(b)) for b in not_legs)


def test_the_llm_d_legs_change_only_what_their_source_changes():
    caller = {"token_ids": [5, 6], "output_mode": "text", "stream": True, "stream_options": {"include_usage": True},
              "sampling_params": {"max_tokens": 8, "stop": ["<&>"], "extra_args": {"k": 1}}}
    p = llmd_legs.sidecar_prefill_leg(caller)
    assert {k: v for k, v in p.items() if k not in ("stream", "kv_transfer_params", "sampling_params")} == {
        "token_ids": [5, 6], "output_mode": "text"}
    assert p["sampling_params"] == {"max_tokens": 1, "min_tokens": 1, "stop": ["<&>"], "extra_args": {"k": 1}}
    assert b'"stop":["\\u003c\\u0026\\u003e"]' in llmd_legs.go_json(p)
    kv = {"do_remote_prefill": True, "remote_block_ids": [1]}
    assert llmd_legs.sidecar_decode_leg(caller, {"kv_transfer_params": kv}) == {**caller, "kv_transfer_params": kv}
    d = llmd_legs.coordinator_decode_leg(caller, {"kv_transfer_params": kv})
    assert "kv_transfer_params" not in d
    assert d["sampling_params"]["extra_args"] == {
        "k": 1, "kv_transfer_params": {**kv, "do_remote_decode": False, "do_remote_prefill": True}}
    assert llmd_legs.coordinator_prefill_leg(caller, "r") == {
        "request_id": "r", "token_ids": [5, 6], "model": "", "stream": False,
        "sampling_params": {"max_tokens": 1, "extra_args": {"kv_transfer_params": llmd_legs.PREFILL_KV}}}
