"""The scripted path matches reality for the parser classes the matrix adds: one real engine each.

tests/app/vllm/test_parser_matrix.py proves our derender equals vLLM's coupled chat over the scripted
engine; tests/engine/decode/test_scripted_parity.py proves the scripted engine answers as the real one for the
generic parser class (DelegatingParser: qwen3 + hermes). Here the same for the other classes
vLLM's ParserManager composes that the matrix runs: `hf` (ResponseTemplateParser, the family
model's response_template), HarmonyParser (the gpt-oss model: o200k, openai_harmony, a real
GptOssForCausalLM with dummy weights) and KimiK3Parser (the kimi_k3 parsers, on the Kimi K3
family model, as the matrix's row runs them). Our server on a real engine answers every case of the
row as our app over the scripted engine does — each choice's batch message and finish_reason,
and the folded stream (the real engine may merge steps, so not chunk by chunk).
Real engines, one per class, all started at once by tests/engine/conftest.py's package fixture
(tests/support/parser_class_servers.py).

Their ends are tests too, on servers thrown away anyway (an engine start less each): a SIGKILL of the
gpt-oss server leaves no engine process behind; the kimi-k3 server runs two API processes (each
answers its cases as one process does), and its engine core's death ends every one of them non-zero.
The `hf` server (two API processes too) also serves the scale-out tests, tests/engine/test_scale_out.py
(after this module by name), and ends by their drain.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support import chat_cases as cc
from tests.support.parser_matrix.harness import pair
from tests.support import parser_class_servers as pcs
from tests.support.parser_class_servers import Run
from tests.support.processes import detached_engine_cores, engine_cores, wait_ended
from tests.support.stream_reader import INDEX, StreamReader, connection_to
from tests.support import GENERATE, finish_reason, scripted

pytestmark = pytest.mark.real_engine

RUNS = pcs.runs()
# The engine death's streams (the demo vocabulary, which kimi-k3's family model extends): ended by
# the death, not by their length.
PROMPT = [9707, 11, 1879]
LONG = {"max_tokens": 4000, "ignore_eos": True}


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


async def _compare(run: Run, model_dir: Path, url: str) -> int:
    compared = 0
    async with pair(model_dir, *run.flags) as p:
        composed = [c.__name__ for c in p.vllm.app.state.openai_serving_chat.parser_cls.__mro__]
        assert run.parser_class in composed, (run.flags, composed)  # the run proves the class it is for
        async with httpx.AsyncClient(base_url=url, timeout=120) as real:
            for case in run.cases:
                script = p.tokenizer.encode(case.text, add_special_tokens=False)
                body = await p.derender_request(cc.chat_body(**case.chat), script)
                assert await _ask(real, body) == await _ask(p.ours.client, body), (run.flags, case.name)
                compared += 1
    return compared


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.name)
def test_a_composed_parser_class_on_a_real_engine_answers_as_on_the_scripted_one(run: Run, parser_class_servers, demo_model):
    url = parser_class_servers[run.name].url
    assert asyncio.run(_compare(run, pcs.model_dir(run, demo_model), url)) == len(run.cases) > 0


def test_its_end_a_sigkill_of_the_server_leaves_no_engine_process(parser_class_servers):
    """The engine core leads a process group of its own, so a signal to the server's group misses it
    (decode_server/process/engine_session.py); it gets SIGTERM when its parent dies instead
    (PR_SET_PDEATHSIG). Without an engine: tests/engine/test_engine_session.py."""
    killed_server = parser_class_servers["gpt-oss"]
    cores = detached_engine_cores(killed_server)
    try:
        killed_server.proc.kill()  # the server's pid only: its group is not signalled
        killed_server.proc.wait(10)
        started = time.monotonic()
        alive = wait_ended(cores, 30)
    finally:
        for core in cores:
            if core.is_running():
                core.kill()
    assert not alive, f"the engine outlived the server by 30 s: {alive}"
    print(f"engine core ended {time.monotonic() - started:.1f} s after the server's SIGKILL")


@pytest.mark.timeout(600, func_only=True)
def test_its_end_with_two_api_processes_the_engine_cores_death_ends_every_process_nonzero(parser_class_servers):
    server = parser_class_servers[pcs.ENGINE_DEATH]
    try:
        with ExitStack() as stack:
            # Both connections and each process's first request first, then both streams at once. A
            # stream started while the other process was still connecting ran all its tokens
            # (4,000 in 16 s) before the other's first three arrived (15 s after it was sent, in a
            # clean-clone run) and ended "length" before the kill.
            clients = {i: connection_to(stack, server.url, i) for i in (0, 1)}
            for i, client in clients.items():
                first = client.post(GENERATE, json=scripted(PROMPT, [9707, 11], sampling_params={"max_tokens": 2}), timeout=60)
                assert first.status_code == 200 and first.headers[INDEX] == str(i), (i, first.text)
            streams = {i: StreamReader(client, scripted(PROMPT, [], request_id=f"death-{i}", sampling_params=LONG)) for i, client in clients.items()}
            for s in streams.values():
                s.wait_events(3)
            children = psutil.Process(server.proc.pid).children(recursive=True)
            killed = time.monotonic()
            for p in engine_cores(server):
                os.kill(p.pid, signal.SIGKILL)
            for s in streams.values():
                s.join(60)
            code = server.proc.wait(60)
            elapsed = time.monotonic() - killed
            alive = wait_ended(children, 30)
    finally:
        server.stop()
    for i, s in streams.items():
        assert s.done(), f"process {i}: {s.payloads()[-3:]}"
        error = s.payloads()[-2].get("error") or {}
        assert error.get("code") == 503 and "dead" in error.get("message", "").lower(), (i, finish_reason(s.payloads()), len(s.payloads()))
    assert code not in (0, None), server.log_tail()
    assert not alive, f"every API process exits: {alive}"
    print(f"engine core killed → parent exited {code} after {elapsed:.1f}s")
    assert elapsed < 30, f"the parent exited {elapsed:.1f}s after the engine core died"
