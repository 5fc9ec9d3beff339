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
Real engines, one per class, all started at once by the module's fixture.

Their ends are tests too, on servers thrown away anyway (an engine start less each): a SIGKILL of the
gpt-oss server leaves no engine process behind; the `hf` server runs two API processes (each
answers its cases as one process does), and its engine core's death ends every one of them non-zero
(the scale-out server of tests/engine/test_api_server_count.py ends by its drain).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support import chat_cases as cc
from tests.support import servers
from tests.support.parser_matrix import families as fm
from tests.support.parser_matrix.harness import pair
from tests.support.parser_matrix.models import family_model
from tests.support.processes import detached_engine_cores, engine_cores
from tests.support.stream_reader import INDEX, StreamReader, connection_to
from tests.support import GENERATE, finish_reason, scripted

pytestmark = pytest.mark.real_engine

HF_ROW = next(row for row in fm.ROWS if row.tool_parser == "hf")
GPT_OSS_ROW = next(row for row in fm.ROWS if row.family == "gpt_oss")
# ParserManager composes KimiK3Parser for the kimi_k3 parser name on any model (not by model type):
# the matrix's Kimi K3 row, on its family model.
KIMI_K3_ROW = next(row for row in fm.ROWS if row.reasoning_parser == "kimi_k3")
# The scale-out death's streams (on the demo vocabulary): ended by the death, not by their length.
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


async def _compare(run: Run, model_dir: Path, real_server: Callable[[], servers.Server]) -> int:
    compared = 0
    async with pair(model_dir, *run.flags) as p:
        composed = [c.__name__ for c in p.vllm.app.state.openai_serving_chat.parser_cls.__mro__]
        assert run.parser_class in composed, (run.flags, composed)  # the run proves the class it is for
        # The scripted pair opened while the real engine was starting; now wait for it (in a thread).
        url = (await asyncio.to_thread(real_server)).url
        async with httpx.AsyncClient(base_url=url, timeout=120) as real:
            for case in run.cases:
                script = p.tokenizer.encode(case.text, add_special_tokens=False)
                body = await p.derender_request(cc.chat_body(**case.chat), script)
                assert await _ask(real, body) == await _ask(p.ours.client, body), (run.flags, case.name)
                compared += 1
    return compared


def _row_cases(row: fm.Row) -> list[fm.Case]:
    # vLLM's render refuses these (asserted in the matrix): no request to compare.
    return [case for case in fm.cases(row) if case.name not in dict(row.refused_at_render)]


@dataclass
class Run:
    """One composed parser class on a real engine: ours with `flags` on `family`'s model."""

    name: str
    parser_class: str
    family: str | None  # a matrix family's model directory; None: the demo model
    flags: list[str]
    cases: list[fm.Case]


RUNS = [
    Run("hf", "ResponseTemplateParser", HF_ROW.family, HF_ROW.flags, _row_cases(HF_ROW)),
    Run("gpt-oss", "HarmonyParser", GPT_OSS_ROW.family, GPT_OSS_ROW.flags, _row_cases(GPT_OSS_ROW)),
    Run("kimi-k3", "KimiK3Parser", KIMI_K3_ROW.family, KIMI_K3_ROW.flags, _row_cases(KIMI_K3_ROW)),
]


def _model_dir(run: Run, demo_model: Path) -> Path:
    # Beside the session's demo model: built once, by the engine's factory and then found by the test.
    return demo_model if run.family is None else family_model(run.family, demo_model.parent / "families", demo_model)


# The server that runs two API processes, for its end (the engine core's death on a scaled-out server).
SCALED_OUT = "hf"


def _engine(run: Run) -> Callable[[Path, Path], servers.Server]:
    # The model is built before the server copies the environment: gpt-oss's sets TIKTOKEN_ENCODINGS_BASE.
    scale_out = ("--api-server-count", "2") if run.name == SCALED_OUT else ()
    return lambda demo_model, log_dir: servers.ours(f"decode-{run.name}", _model_dir(run, demo_model), log_dir, *run.flags, *scale_out)


@pytest.fixture(scope="module")
def real_engines(demo_model, log_dir):
    """Run name -> its server, all three started at once: one wait, not three."""
    with servers.running(*(_engine(run)(demo_model, log_dir) for run in RUNS)) as started:
        yield {run.name: server for run, server in zip(RUNS, started)}


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.name)
def test_a_composed_parser_class_on_a_real_engine_answers_as_on_the_scripted_one(run: Run, real_engines, demo_model):
    server = functools.partial(real_engines.get, run.name)
    assert asyncio.run(_compare(run, _model_dir(run, demo_model), server)) == len(run.cases) > 0


def test_its_end_a_sigkill_of_the_server_leaves_no_engine_process(real_engines):
    """The engine core leads a process group of its own, so a signal to the server's group misses it
    (decode_server/process/engine_session.py); it gets SIGTERM when its parent dies instead
    (PR_SET_PDEATHSIG). Without an engine: tests/engine/test_engine_session.py."""
    killed_server = real_engines["gpt-oss"]
    cores = detached_engine_cores(killed_server)
    try:
        killed_server.proc.kill()  # the server's pid only: its group is not signalled
        killed_server.proc.wait(10)
        started = time.monotonic()
        _, alive = psutil.wait_procs(cores, timeout=30)
    finally:
        for core in cores:
            if core.is_running():
                core.kill()
    assert not alive, f"the engine outlived the server by 30 s: {alive}"
    print(f"engine core ended {time.monotonic() - started:.1f} s after the server's SIGKILL")


@pytest.mark.timeout(600, func_only=True)
def test_its_end_with_two_api_processes_the_engine_cores_death_ends_every_process_nonzero(real_engines):
    server = real_engines[SCALED_OUT]
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
            _, alive = psutil.wait_procs(children, timeout=30)
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
