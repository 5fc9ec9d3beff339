"""vLLM's admission limits answer 503 with Retry-After and a reason, never a 500 or a stack trace (issue #13)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests import servers
from tests.support import GENERATE, _until, scripted

pytestmark = pytest.mark.reliability


@pytest.fixture(scope="module")
def tiny_queue(demo_model, log_dir):
    # vLLM counts every unfinished request against --max-num-queued-reqs: with 1, the second
    # concurrent request is over the limit (the later --max-num-seqs wins over the shared flags').
    server = servers.ours("overload", demo_model, log_dir, "--max-num-seqs", "1", "--max-num-queued-reqs", "1").start()
    yield server
    server.stop()


def test_queue_overflow_is_a_503_with_retry_after_and_no_stack_trace(tiny_queue):
    long = {"max_tokens": 2000, "ignore_eos": True}

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(timeout=120) as client:
            running = asyncio.create_task(client.post(tiny_queue.url + GENERATE, json=scripted([9707], [], request_id="run", sampling_params=long)))
            await _until(client, tiny_queue.url, lambda m: m["vllm:num_requests_running"] >= 1)
            rejected = await client.post(tiny_queue.url + GENERATE, json=scripted([9707], [11], request_id="over"))
            await client.post(tiny_queue.url + "/abort_requests", json={"request_ids": ["run"]})
            assert (await running).status_code == 200
            return rejected

    r = asyncio.run(run())
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    error = r.json()["error"]
    assert error["code"] == 503 and "busy" in error["message"], "vLLM's own QueueOverflowError message"
    assert "Traceback" not in tiny_queue.log_tail(200_000)
