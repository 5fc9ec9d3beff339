"""A P/D instance's own rules, in process: what a `--tokens-only` prefill pool answers, and that a
decode leg refused before it starts tells the KV connector to release the prefill blocks.

The real app over the scripted engine (tests/support/inprocess.py): the connector is not modelled, so the
release is read where it reaches the engine (`core.released_kv`: vLLM's pre-aborted request that
only runs the connector's hook). The real-NIXL checks stay in tests/engine/pd/test_pd.py: the producer's KV
params, llm-d's prefill legs answered as tokens-level prefills, and one refused decode leg that
frees the prefill instance's blocks before its lease.
"""

from __future__ import annotations

import pytest

from protocol.generate import FINGERPRINT_HEADER
from tests.support import llmd_legs
from tests.support.inprocess import PROMPT, error_of, serve
from tests.support.pd_pair import kv_config
from tests.support.servers import PARSER_FLAGS
from tests.support import GENERATE, scripted

pytestmark = pytest.mark.anyio

# What a prefill instance answers (vLLM's NixlConnector request_finished), as the decode leg carries it.
PULL = {
    "do_remote_decode": False,
    "do_remote_prefill": True,
    "remote_engine_id": "prefill-engine",
    "remote_block_ids": [[3, 4]],
    "remote_host": "10.0.0.7",
    "remote_port": 5601,
    "remote_request_id": "prefill-req",
}
LEG = {"do_remote_decode": True}


async def test_a_prefill_pool_answers_only_an_unambiguous_prefill_leg(demo_model):
    """A decode-leg request misrouted to the prefill pool fails loud; only `do_remote_decode: true`
    with max_tokens 1 (top level or in extra_args, as llm-d's two routers send it) is answered as a
    tokens-level prefill, its decode-only fields dropped."""
    async with serve(demo_model, "--tokens-only") as s:
        for mode in ("text", "derender"):
            code, message, param = error_of(await s.client.post(GENERATE, json={"token_ids": PROMPT, "output_mode": mode}))
            assert (code, param) == (400, "output_mode") and "requires a tokenizer" in message
        not_legs = (
            {"output_mode": "text", "kv_transfer_params": LEG, "sampling_params": {"max_tokens": 2}},
            {"output_mode": "text", "sampling_params": {"max_tokens": 2, "extra_args": {"kv_transfer_params": LEG}}},
            {"output_mode": "derender", "sampling_params": {"max_tokens": 1}},
            {"output_mode": "text", "kv_transfer_params": {"do_remote_decode": False}, "sampling_params": {"max_tokens": 1}},
        )
        for body in not_legs:
            code, message, _ = error_of(await s.client.post(GENERATE, json={"token_ids": PROMPT, **body}))
            assert code == 400 and "requires a tokenizer" in message, body
        stop_leg = {"max_tokens": 4, "stop": ["."], "extra_args": {"kv_transfer_params": LEG}}
        code, message, _ = error_of(await s.client.post(GENERATE, json={"token_ids": PROMPT, "sampling_params": stop_leg}))
        assert code == 400 and "stop strings" in message
        code, message, _ = error_of(
            await s.client.post(GENERATE, json={"token_ids": PROMPT}, headers={FINGERPRINT_HEADER: "0" * 16})
        )
        assert code == 409 and "fingerprint" in message
        assert s.core.seen == [], "every refusal came before the engine"
        caller = scripted(PROMPT, [7, 8], output_mode="derender", parse_context={}, sampling_params={"stop": ["x"]})
        # ... whatever the fingerprint (a prefill leg's answer reaches no client).
        headers = {"content-type": "application/json", FINGERPRINT_HEADER: "0" * 16}
        for leg in (llmd_legs.sidecar_prefill_leg(caller), llmd_legs.coordinator_prefill_leg(caller, "r")):
            r = await s.client.post(GENERATE, content=llmd_legs.go_json(leg), headers=headers)
            assert r.status_code == 200, r.text
            assert r.json()["output_mode"] == "tokens" and len(r.json()["choices"][0]["token_ids"]) == 1


@pytest.mark.parametrize("where", ["top_level", "extra_args"])
async def test_a_refused_decode_leg_releases_the_prefill_blocks_once(demo_model, where):
    """`extra_args`: the decode leg as llm-d's coordinator builds it (tests/support/llmd_legs.py). Only a
    refused leg that pulls KV releases it; a served one and a refused plain request release nothing."""
    async with serve(demo_model, *PARSER_FLAGS, "--kv-transfer-config", kv_config("kv_consumer")) as s:
        build = llmd_legs.sidecar_decode_leg if where == "top_level" else llmd_legs.coordinator_decode_leg
        refused = build({"token_ids": PROMPT, "output_mode": "derender"}, {"kv_transfer_params": PULL})
        r = await s.client.post(GENERATE, content=llmd_legs.go_json(refused), headers={"content-type": "application/json"})
        code, message, param = error_of(r)
        assert (code, param) == (400, "parse_context") and "needs parse_context" in message
        assert [req.sampling_params.extra_args["kv_transfer_params"] for req in s.core.released_kv] == [PULL]
        assert s.core.released_kv[0].abort_immediately and s.core.released_kv[0].sampling_params.max_tokens == 1
        code, _, _ = error_of(await s.client.post(GENERATE, json={"token_ids": PROMPT, "output_mode": "derender"}))
        assert code == 400
        served = build(scripted(PROMPT, [7, 8]), {"kv_transfer_params": PULL})
        r = await s.client.post(GENERATE, content=llmd_legs.go_json(served), headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"][:2] == [7, 8], r.text
        assert len(s.core.released_kv) == 1, "released once, for the refused leg only"
