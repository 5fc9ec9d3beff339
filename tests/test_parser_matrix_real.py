"""The scripted path matches reality for the parser classes the matrix adds: one real engine each.

tests/test_parser_matrix.py proves our derender equals vLLM's coupled chat over the scripted
engine; tests/test_scripted_parity.py proves the scripted engine answers as the real one for the
generic parser class (qwen3 + hermes). Here the same for vLLM's `hf` class (ResponseTemplateParser,
the family model's response_template): our server on a real engine answers every case of the
family row as our app over the scripted engine does — each choice's batch message and
finish_reason, and the folded stream (the real engine may merge steps, so not chunk by chunk).
Real engine: run under the engine lock.

Its end is a test too, on a server thrown away anyway (one engine start less): a SIGKILL of the
server leaves no engine process behind.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import psutil
import pytest

from decode_server.tools.family_tokenizers import build_family_model
from tests import chat_cases as cc
from tests import servers
from tests.parser_matrix import families as fm
from tests.parser_matrix.harness import pair
from tests.processes import detached_engine_cores
from tests.support import GENERATE

pytestmark = pytest.mark.real_engine

HF_ROW = next(row for row in fm.ROWS if row.tool_parser == "hf")


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


async def _compare(url: str, model_dir, row: fm.Row) -> int:
    compared = 0
    async with pair(model_dir, *row.flags) as p, httpx.AsyncClient(base_url=url, timeout=120) as real:
        for case in fm.cases(row):
            if case.name in dict(row.refused_at_render):
                continue  # vLLM's render refuses these (asserted in the matrix): no request to compare
            script = p.tokenizer.encode(case.text, add_special_tokens=False)
            body = await p.derender_request(cc.chat_body(**case.chat), script)
            assert await _ask(real, body) == await _ask(p.ours.client, body), (row.id, case.name)
            compared += 1
    return compared


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory, demo_model):
    return build_family_model(HF_ROW.family, tmp_path_factory.mktemp("families") / HF_ROW.family, demo_model)


@pytest.fixture(scope="module")
def hf_server(hf_model, log_dir):
    server = servers.ours("decode-hf", hf_model, log_dir, *HF_ROW.flags).start()
    try:
        yield server
    finally:
        server.stop()


def test_hf_parser_on_a_real_engine_answers_as_on_the_scripted_one(hf_server, hf_model):
    compared = asyncio.run(_compare(hf_server.url, hf_model, HF_ROW))
    assert compared == len(fm.cases(HF_ROW)) - len(HF_ROW.refused_at_render)


def test_its_end_a_sigkill_of_the_server_leaves_no_engine_process(hf_server):
    """The engine core leads a session of its own, so a signal to the server's group misses it
    (decode_server/process/engine_session.py); it gets SIGTERM when its parent dies instead
    (PR_SET_PDEATHSIG). Without an engine: tests/test_engine_session.py."""
    cores = detached_engine_cores(hf_server)
    try:
        hf_server.proc.kill()  # the server's pid only: its group is not signalled
        hf_server.proc.wait(10)
        started = time.monotonic()
        _, alive = psutil.wait_procs(cores, timeout=30)
    finally:
        for core in cores:
            if core.is_running():
                core.kill()
    assert not alive, f"the engine outlived the server by 30 s: {alive}"
    print(f"engine core ended {time.monotonic() - started:.1f} s after the server's SIGKILL")
