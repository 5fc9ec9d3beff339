"""KV-transfer params (P/D disaggregation): where a request carries them, which leg it is, and a
decode leg's bound: its KV arrives (first token) within a deadline, or it ends clearly.

A P/D router sends each request twice: a prefill leg (`do_remote_decode`, one token, its answer
thrown away) and a decode leg (`do_remote_prefill`), which waits for vLLM's KV connector to pull
the prompt's blocks from the prefill instance. vLLM 0.32's NixlConnector bounds the side-channel
handshake (a 5 s ZMQ receive timeout) but not a transfer: a prefill process that is alive but
stalled (stopped, swapping, a wedged NIC) leaves the request in WAITING_FOR_REMOTE_KVS forever.

`first_token_within` wraps the engine's outputs: if the request has no first token `timeout_s`
(DECODE_SERVER_REMOTE_PREFILL_TIMEOUT_S) after it started (queueing for a slot, the transfer, and
under `kv_load_failure_policy: recompute` the local recompute all count), the engine request is
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

import msgspec
from vllm.outputs import RequestOutput

from decode_server.errors import ServerError
from protocol.generate import GenerateRequest


def kv_transfer_params_of(req: GenerateRequest) -> dict[str, Any] | None:
    """The KV-transfer params the engine gets: the top-level field (vLLM's generate, llm-d's routing
    sidecar), else `sampling_params.extra_args.kv_transfer_params` (llm-d's coordinator). The top
    level wins, as in the SamplingParams the engine gets and in vLLM's generate."""
    if req.kv_transfer_params is not None:
        return req.kv_transfer_params
    extra = req.sampling_params.extra_args
    params = extra.get("kv_transfer_params") if isinstance(extra, dict) else None
    return params if isinstance(params, dict) else None


def is_prefill_leg(req: GenerateRequest) -> bool:
    """A P/D router's prefill leg: its KV stays for a remote decoder (`do_remote_decode: true`) and
    it asks for one token, which every router throws away (llm-d's sidecar and coordinator, and
    `protocol.clients.pd`, keep only the answer's `kv_transfer_params`): its answer never reaches a client."""
    kv = kv_transfer_params_of(req)
    return kv is not None and kv.get("do_remote_decode") is True and req.sampling_params.max_tokens == 1


def as_tokens_prefill_leg(req: GenerateRequest) -> GenerateRequest:
    """The prefill leg without what only its decode leg reads and a server without a tokenizer
    cannot serve (llm-d's sidecar forwards all of it): the text levels and their chat context,
    stop strings, structured outputs. Its one token is discarded, so none of them can matter."""
    sampling = msgspec.structs.replace(req.sampling_params, stop=msgspec.UNSET, structured_outputs=msgspec.UNSET)
    return msgspec.structs.replace(
        req, output_mode="tokens", parse_context=None, chat_request=None, sampling_params=sampling
    )


def is_remote_prefill(kv_transfer_params: Any) -> bool:
    """A decode leg: its prompt's KV is pulled from a prefill instance."""
    return isinstance(kv_transfer_params, dict) and bool(kv_transfer_params.get("do_remote_prefill"))


# ------------------------------------------------------------------ a decode leg's first-token deadline


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
    timeout_s: float,
    outcome: Callable[[str], None] = lambda _: None,
) -> AsyncIterator[RequestOutput]:
    """`outputs`, unless the request has no first token `timeout_s` after it started (504; the
    engine request aborted) or vLLM failed its KV load (502). `first_token_pending()`: whether
    the engine still prefills it (a batch request's one output comes only at the end).
    `outcome` is told how the KV arrived, once: "ok" (a first token), "timeout" or "failed"; not
    at all when the request ended otherwise first (aborted, its client gone, the engine dead)."""
    it = aiter(outputs)
    first = asyncio.ensure_future(anext(it))
    try:
        done, _ = await asyncio.wait({first}, timeout=timeout_s if timeout_s > 0 else None)
        if not done and not first.done() and first_token_pending():
            first.cancel()  # vLLM's generate aborts the request on the cancellation
            with contextlib.suppress(BaseException):
                await first
            outcome("timeout")
            raise timed_out(kv, timeout_s)
        output = await first
    except StopAsyncIteration:
        return
    finally:
        if not first.done():  # the caller went away (cancelled) while waiting
            first.cancel()
    if _failed_before_first_token(output):
        outcome("failed")
        raise load_failed(kv)
    if any(o.token_ids for o in output.outputs):
        outcome("ok")
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
