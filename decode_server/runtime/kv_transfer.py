"""A remote-prefill request's bound: its KV arrives (first token) within a deadline, or it ends clearly.

A decode leg (`kv_transfer_params.do_remote_prefill`) waits for vLLM's KV connector to pull the
prompt's blocks from the prefill instance. vLLM 0.32's NixlConnector bounds the side-channel
handshake (a 5 s ZMQ receive timeout) but not a transfer: a prefill process that is alive but
stalled (stopped, swapping, a wedged NIC) leaves the request in WAITING_FOR_REMOTE_KVS forever.

`first_token_within` wraps the engine's outputs: if the request has no first token
`REMOTE_PREFILL_TIMEOUT_S` after it started (queueing for a slot, the transfer, and under
`kv_load_failure_policy: recompute` the local recompute all count), the engine request is
aborted (the connector then tells the prefill instance to free its blocks, or its lease does)
and the client gets a 504 before any body, batch or stream. A KV load vLLM reports as failed
(`kv_load_failure_policy: fail`, vLLM's default: finish reason "error" before any token) is a
502 naming the prefill instance instead of vLLM's bare "Internal server error".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from vllm.outputs import RequestOutput

from decode_server.config import REMOTE_PREFILL_TIMEOUT_S
from decode_server.errors import ServerError


def is_remote_prefill(kv_transfer_params: Any) -> bool:
    return isinstance(kv_transfer_params, dict) and bool(kv_transfer_params.get("do_remote_prefill"))


def _source(kv: dict[str, Any]) -> str:
    return f"prefill engine {kv.get('remote_engine_id')!r} at {kv.get('remote_host')}:{kv.get('remote_port')}"


def timed_out(kv: dict[str, Any], timeout_s: float) -> ServerError:
    return ServerError(
        f"remote prefill timed out: no first token {timeout_s:g} s after the request started (the KV "
        f"transfer from the {_source(kv)} did not complete; DECODE_SERVER_REMOTE_PREFILL_TIMEOUT_S); "
        "the request was aborted",
        status=504,
        param="kv_transfer_params",
        reason="remote_prefill_timeout",
    )


def load_failed(kv: dict[str, Any]) -> ServerError:
    return ServerError(
        f"remote prefill failed: the KV blocks could not be loaded from the {_source(kv)} "
        "(kv_load_failure_policy: fail; the prefill instance is gone, unreachable or freed them)",
        status=502,
        param="kv_transfer_params",
        reason="remote_prefill_failed",
    )


def _failed_before_first_token(output: RequestOutput) -> bool:
    return any(o.finish_reason == "error" and not o.token_ids for o in output.outputs)


async def first_token_within(
    outputs: AsyncIterator[RequestOutput],
    kv: dict[str, Any],
    first_token_pending: Callable[[], bool],
    timeout_s: float = REMOTE_PREFILL_TIMEOUT_S,
) -> AsyncIterator[RequestOutput]:
    """`outputs`, unless the request has no first token `timeout_s` after it started (504; the
    engine request aborted) or vLLM failed its KV load (502). `first_token_pending()`: whether
    the engine still prefills it (a batch request's one output comes only at the end)."""
    it = aiter(outputs)
    first = asyncio.ensure_future(anext(it))
    try:
        done, _ = await asyncio.wait({first}, timeout=timeout_s if timeout_s > 0 else None)
        if not done and not first.done() and first_token_pending():
            first.cancel()  # vLLM's generate aborts the request on the cancellation
            with contextlib.suppress(BaseException):
                await first
            raise timed_out(kv, timeout_s)
        output = await first
    except StopAsyncIteration:
        return
    finally:
        if not first.done():  # the caller went away (cancelled) while waiting
            first.cancel()
    if _failed_before_first_token(output):
        raise load_failed(kv)
    yield output
    async for output in it:
        yield output


def first_token_pending(llm: Any, engine_ids: set[str]) -> bool:
    """Whether any of these engine requests has no first token yet (or is not admitted yet)."""
    processor = llm.output_processor
    for engine_id in engine_ids:
        internal = processor.external_req_ids.get(engine_id)
        if not internal:
            return True
        states = (processor.request_states.get(i) for i in internal)
        if any(s is not None and s.is_prefilling for s in states):
            return True
    return False
