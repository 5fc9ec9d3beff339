"""vLLM's own server, in process over the scripted engine: its generate and ours answer alike.

Both apps get RequestOutputs from the same scripted engine (logprob values included: they are seeded
by the token history), so their answers are compared whole, bar `created`. The real-engine
differential (tests/app/vllm/test_differential.py) stays the proof on a real engine.
"""

from __future__ import annotations

import pytest

from tests.support.inprocess import serve, vllm_serve
from tests.support.servers import PARSER_FLAGS
from tests.support import GENERATE, scripted

pytestmark = pytest.mark.anyio

PROMPT = [9707, 1879]
SCRIPT = [9707, 11, 1879, 0, 21927, 1052, 13]  # "Hello, world! Hello there."
BODIES = {
    "tokens_logprobs": scripted(PROMPT, SCRIPT, sampling_params={"logprobs": 2, "prompt_logprobs": 1}, return_token_ids=True),
    "tokens_n2_length": scripted(PROMPT, SCRIPT, sampling_params={"n": 2, "max_tokens": 3}),
    "text_stop_string": scripted(PROMPT, SCRIPT, output_mode="text", sampling_params={"stop": ["world"], "logprobs": 1}),
    "text_stop_token_id": scripted(PROMPT, SCRIPT, output_mode="text", sampling_params={"stop_token_ids": [0]}),
}


def _without_created(obj):
    return {k: v for k, v in obj.items() if k != "created"}


async def test_vllms_generate_and_ours_answer_alike_on_the_same_engine_outputs(demo_model):
    answers = {}
    for name, start in (("ours", serve), ("vllm", vllm_serve)):
        async with start(demo_model, *PARSER_FLAGS) as s:
            answers[name] = {}
            for case, body in BODIES.items():
                body = {**body, "request_id": case, "stream_options": {"include_usage": True}}
                r = await s.client.post(GENERATE, json=body)
                assert r.status_code == 200, (name, case, r.text)
                answers[name][case] = (_without_created(r.json()), await s.events(body))
    for case in BODIES:
        assert answers["ours"][case] == answers["vllm"][case], case


async def test_vllms_coupled_chat_runs_on_the_scripted_engine(demo_model):
    async with vllm_serve(demo_model, *PARSER_FLAGS) as v:
        script = v.llm.tokenizer.encode("<think>\nok\n</think>\n\nHello there.", add_special_tokens=False)
        chat = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "vllm_xargs": {"replay_token_ids": script}}
        r = await v.client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert (choice["message"]["reasoning"], choice["message"]["content"]) == ("\nok\n", "\n\nHello there.")
        assert choice["finish_reason"] == "stop"
        rendered = v.core.seen[-1].prompt_token_ids
        assert v.llm.tokenizer.decode(rendered).startswith("<|im_start|>user\nhi"), "vLLM rendered the chat"
