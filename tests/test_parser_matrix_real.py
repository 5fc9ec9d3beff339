"""The scripted path matches reality for the parser classes the matrix adds: one real engine each.

tests/test_parser_matrix.py proves our derender equals vLLM's coupled chat over the scripted
engine; tests/test_scripted_parity.py proves the scripted engine answers as the real one for the
generic parser class (DelegatingParser: qwen3 + hermes). Here the same for the other classes
vLLM's ParserManager composes that the matrix runs: `hf` (ResponseTemplateParser, the family
model's response_template), HarmonyParser (the gpt-oss model: o200k, openai_harmony, a real
GptOssForCausalLM with dummy weights) and KimiK3Parser (the kimi_k3 reasoning parser, on the demo
model, as the matrix's sweep runs it). Our server on a real engine answers every case of the
row as our app over the scripted engine does — each choice's batch message and finish_reason,
and the folded stream (the real engine may merge steps, so not chunk by chunk).
Real engine: run under the engine lock.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests import chat_cases as cc
from tests import servers
from tests.parser_matrix import families as fm
from tests.parser_matrix.coverage import SWEEP, sweep_cases
from tests.parser_matrix.harness import pair
from tests.parser_matrix.models import family_model
from tests.support import GENERATE

pytestmark = pytest.mark.real_engine

HF_ROW = next(row for row in fm.ROWS if row.tool_parser == "hf")
GPT_OSS_ROW = next(row for row in fm.ROWS if row.family == "gpt_oss")
# ParserManager composes KimiK3Parser for the kimi_k3 parser name on any model (not by model type):
# the sweep's configuration with the kimi_k3 reasoning parser, on the demo model.
KIMI_K3 = next((tool, reasoning) for tool, reasoning in SWEEP if reasoning == "kimi_k3")


def _answers(batch: dict[str, Any], events: list[dict[str, Any]]) -> dict[int, Any]:
    out: dict[int, Any] = {c["index"]: [cc.without_ids(cc.batch_message(c["message"])), c["finish_reason"]] for c in batch["choices"]}
    deltas: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        for c in event.get("choices", []):
            deltas.setdefault(c["index"], []).append(c["delta"])
            if c.get("finish_reason"):
                out[c["index"]].append(c["finish_reason"])
    for i, ds in deltas.items():
        out[i].append(cc.without_ids(cc.accumulate(ds)))
    return out


async def _ask(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[int, Any]:
    batch = await client.post(GENERATE, json={**body, "stream": False})
    assert batch.status_code == 200, batch.text
    events = []
    async with client.stream("POST", GENERATE, json={**body, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return _answers(batch.json(), events)


async def _compare(url: str, model_dir, flags: list[str], cases: list[fm.Case], parser_class: str) -> int:
    compared = 0
    async with pair(model_dir, *flags) as p, httpx.AsyncClient(base_url=url, timeout=120) as real:
        composed = [c.__name__ for c in p.vllm.app.state.openai_serving_chat.parser_cls.__mro__]
        assert parser_class in composed, (flags, composed)  # the run proves the class it is for
        for case in cases:
            script = p.tokenizer.encode(case.text, add_special_tokens=False)
            body = await p.derender_request(cc.chat_body(**case.chat), script)
            assert await _ask(real, body) == await _ask(p.ours.client, body), (flags, case.name)
            compared += 1
    return compared


def _real_run(name: str, model_dir, log_dir, flags: list[str], cases: list[fm.Case], parser_class: str) -> int:
    server = servers.ours(name, model_dir, log_dir, *flags).start()
    try:
        return asyncio.run(_compare(server.url, model_dir, flags, cases, parser_class))
    finally:
        server.stop()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, demo_model):
    root = tmp_path_factory.mktemp("families")
    return lambda family: family_model(family, root, demo_model)


def _row_cases(row: fm.Row) -> list[fm.Case]:
    # vLLM's render refuses these (asserted in the matrix): no request to compare.
    return [case for case in fm.cases(row) if case.name not in dict(row.refused_at_render)]


def test_hf_parser_on_a_real_engine_answers_as_on_the_scripted_one(model_dirs, log_dir):
    cases = _row_cases(HF_ROW)
    assert _real_run("decode-hf", model_dirs(HF_ROW.family), log_dir, HF_ROW.flags, cases, "ResponseTemplateParser") == len(cases) > 0


def test_harmony_parser_on_a_real_engine_answers_as_on_the_scripted_one(model_dirs, log_dir):
    # family_model points TIKTOKEN_ENCODINGS_BASE at the o200k copy; the server inherits it.
    model_dir = model_dirs(GPT_OSS_ROW.family)
    cases = _row_cases(GPT_OSS_ROW)
    assert _real_run("decode-gpt-oss", model_dir, log_dir, GPT_OSS_ROW.flags, cases, "HarmonyParser") == len(cases) > 0


def test_kimi_k3_parser_on_a_real_engine_answers_as_on_the_scripted_one(demo_model, log_dir):
    cases = sweep_cases(KIMI_K3[0] is not None)
    assert _real_run("decode-kimi-k3", demo_model, log_dir, fm.flags(*KIMI_K3), cases, "KimiK3Parser") == len(cases) > 0
