"""A P/D decode leg's remote-prefill bounds (decode_server/runtime/kv_transfer.py's
`first_token_within`) over stub engine outputs: no engine, no process. The same bounds with real NIXL
instances: tests/engine/pd/test_pd_faults.py."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from decode_server.errors import ServerError
from decode_server.runtime.kv_transfer import first_token_within


def _output(token_ids: list[int], finish_reason: str | None = None) -> Any:
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=token_ids, finish_reason=finish_reason)])


async def _drain(outputs: Any) -> list[Any]:
    return [o async for o in outputs]


def test_the_deadline_aborts_a_request_with_no_first_token_and_spares_one_that_has_it():
    cancelled: list[bool] = []

    async def never() -> Any:
        try:
            await asyncio.sleep(3600)
            yield _output([1])
        except asyncio.CancelledError:  # what vLLM's generate turns into an abort
            cancelled.append(True)
            raise

    async def batch() -> Any:  # one output, at the end: the first token came long before
        await asyncio.sleep(0.3)
        yield _output([1, 2], "length")

    kv = {"remote_engine_id": "e1", "remote_host": "10.0.0.1", "remote_port": 5600}
    t0 = time.monotonic()
    with pytest.raises(ServerError) as e:
        asyncio.run(_drain(first_token_within(never(), kv, lambda: True, timeout_s=0.2)))
    assert time.monotonic() - t0 < 2 and cancelled == [True]
    assert (e.value.status, e.value.reason, e.value.param) == (504, "remote_prefill_timeout", "kv_transfer_params")
    assert "no first token 0.2 s after" in e.value.message and "'e1' at 10.0.0.1:5600" in e.value.message
    got = asyncio.run(_drain(first_token_within(batch(), kv, lambda: False, timeout_s=0.1)))
    assert [o.outputs[0].token_ids for o in got] == [[1, 2]]


def test_a_kv_load_failure_before_the_first_token_is_a_502_naming_the_prefill_instance():
    async def failed() -> Any:
        yield _output([], "error")

    async def late_error() -> Any:  # an error after tokens is not the KV load's: left to the pipeline
        yield _output([1])
        yield _output([], "error")

    kv = {"remote_engine_id": "e1", "remote_host": "h", "remote_port": 1}
    with pytest.raises(ServerError) as e:
        asyncio.run(_drain(first_token_within(failed(), kv, lambda: True, timeout_s=5)))
    assert (e.value.status, e.value.reason) == (502, "remote_prefill_failed")
    assert e.value.message.startswith("remote prefill failed: the KV blocks could not be loaded from the prefill engine 'e1' at h:1")
    assert len(asyncio.run(_drain(first_token_within(late_error(), kv, lambda: True, timeout_s=5)))) == 2
