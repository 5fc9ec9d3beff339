"""Admission: one ordered step from a generate request's body to what the engine and the stages need.

decode the body → normalise a P/D leg → the rules (the parser fingerprint, the model, the
request's own, vLLM's SamplingParams and the rules on them) → the final stage's plan. The first
that fails answers: each raises `Rejected` with its message, in vLLM's order where vLLM has one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils import random_uuid

from decode_server.compat import PARSE_CONTEXT_ERROR
from decode_server.errors import Rejected
from decode_server.generate.modes import MODES, Mode
from decode_server.generate.pipeline.derender_plan import Derenderer
from decode_server.generate.rules import (
    forbid_chat_request_outside_derender,
    forbid_deep_json,
    forbid_fingerprint_drift,
    forbid_invalid_cache_salt,
    forbid_invalid_raw_cache_salt,
    forbid_logprobs_above_server_max,
    forbid_multimodal_input,
    forbid_n_above_max_num_seqs,
    forbid_out_of_vocab_token_ids,
    forbid_params_the_engine_cannot_carry,
    forbid_prompt_logprob_token_ids_in_streams,
    forbid_prompt_without_room_for_output,
    forbid_stop_strings_without_tokenizer,
    forbid_text_levels_without_detokenize,
    forbid_text_levels_without_tokenizer,
    forbid_unreadable_request_id,
)
from decode_server.generate.sampling import sampling_params
from decode_server.runtime.engine import Engine, EngineLimits
from decode_server.runtime.kv_transfer import as_tokens_prefill_leg, is_prefill_leg, kv_transfer_params_of
from decode_server.runtime.lora import Models
from decode_server.runtime.metrics import Metrics
from decode_server.runtime.request_record import RequestRecord
from protocol.decoding import MAX_IGNORED_FIELDS, decode_generate_request
from protocol.generate import FINGERPRINT_HEADER, REQUEST_ID_HEADER, GenerateRequest

log = logging.getLogger("decode_server.generate.admission")


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request every rule let through, with what its engine request and its stages are built from."""

    req: GenerateRequest
    mode: Mode
    sampling_params: SamplingParams
    lora: LoRARequest | None  # the adapter `model` names; None: the base model
    plan: Any  # the final stage's plan (derender: a DerenderPlan), or None
    kv_transfer_params: dict[str, Any] | None  # wherever the request carried them


class Admission:
    def __init__(
        self, engine: Engine, models: Models, derenderer: Derenderer, fingerprint: str, metrics: Metrics, tokens_only: bool
    ):
        self.engine = engine
        self.limits = engine.limits
        self.models = models
        self.derenderer = derenderer
        self.fingerprint = fingerprint
        self.metrics = metrics
        self.tokens_only = tokens_only

    @contextlib.asynccontextmanager
    async def admitted(self, body: bytes, headers: Mapping[str, str], record: RequestRecord) -> AsyncIterator[Admitted]:
        """The request, admitted. Inside the block (until the answer starts), a decode leg refused
        with a 4xx, or whose client went away, has its prefill instance free the KV blocks it holds."""
        req = decode_generate(body, headers.get(REQUEST_ID_HEADER), self.metrics)
        prefill_leg = is_prefill_leg(req)
        if prefill_leg and not self.limits.has_tokenizer:
            # A P/D router's prefill leg is answered as a tokens-level prefill, whatever decode-only
            # fields llm-d's sidecar left on it; anything else as sent, failing loud below.
            req = as_tokens_prefill_leg(req)
        kv = kv_transfer_params_of(req)
        record.named(req.request_id, req.output_mode)
        async with self.engine.released_if_refused(req.request_id, kv):
            yield await self._checked(req, kv, prefill_leg, headers.get(FINGERPRINT_HEADER))

    async def _checked(
        self, req: GenerateRequest, kv: dict[str, Any] | None, prefill_leg: bool, fingerprint: str | None
    ) -> Admitted:
        mode = MODES[req.output_mode]
        await forbid_parse_context_the_vllm_refuses(req)
        # Without a tokenizer the fingerprint cannot match a decode pool's (it hashes no vocabulary):
        # a prefill leg, whose answer never reaches the client, leaves the check to its decode leg.
        if self.limits.has_tokenizer or not prefill_leg:
            forbid_fingerprint_drift(fingerprint, self.fingerprint)
        lora = await self.models.resolve(req.model)  # unknown: 404
        sp = checked_sampling_params(
            req, mode, self.limits, tokens_only=self.tokens_only, generation_defaults=self.engine.generation_defaults
        )
        plan = self.derenderer.plan(req.parse_context, req.chat_request, sp.structured_outputs) if mode.reads_chat_context else None
        return Admitted(req, mode, sp, lora, plan, kv)


async def forbid_parse_context_the_vllm_refuses(req: GenerateRequest) -> None:
    """Where the pool's vLLM validates `parse_context` at every level (0.33), with its answer."""
    if req.parse_context is None:
        return
    refused = await PARSE_CONTEXT_ERROR({"output_mode": req.output_mode, "parse_context": req.parse_context})
    if refused is not None:
        status, error = refused
        raise Rejected(error["message"], status=status, param=error["param"], reason="invalid_parse_context",
                       error_type=error["type"])


def checked_sampling_params(
    req: GenerateRequest, mode: Mode, limits: EngineLimits, *, tokens_only: bool, generation_defaults: dict[str, Any]
) -> SamplingParams:
    """The request's own rules, vLLM's SamplingParams (its checks), then the rules on those."""
    provided = req.sampling_params.provided()
    forbid_multimodal_input(req)
    forbid_out_of_vocab_token_ids(req, limits)
    forbid_text_levels_without_tokenizer(mode, limits)
    forbid_text_levels_without_detokenize(mode, provided)
    forbid_stop_strings_without_tokenizer(provided, limits)
    forbid_chat_request_outside_derender(req, mode)
    forbid_prompt_logprob_token_ids_in_streams(req, provided)
    sp = sampling_params(req, provided, mode, limits, tokens_only=tokens_only, generation_defaults=generation_defaults)
    forbid_n_above_max_num_seqs(sp.n, limits)
    forbid_logprobs_above_server_max(sp, limits)
    forbid_prompt_without_room_for_output(len(req.token_ids), limits)
    forbid_params_the_engine_cannot_carry(sp)
    return sp


# ------------------------------------------------------------------ decoding the body


def decode_generate(body: bytes, header_request_id: str | None, metrics: Metrics) -> GenerateRequest:
    """Decode as vLLM's pydantic model would (lax types, unknown fields ignored), name the request."""
    forbid_deep_json(body)
    try:
        req, ignored = decode_generate_request(body)
    except msgspec.ValidationError as e:
        forbid_invalid_raw_cache_salt(body)  # vLLM checks it before the schema
        # "Bad Request" is the type vLLM's schema errors carry (FastAPI's validation handler).
        raise Rejected(f"invalid request: {e}", reason="invalid_field", error_type="Bad Request") from e
    except msgspec.DecodeError as e:
        raise Rejected(f"request body is not valid JSON: {e}", reason="invalid_json", error_type="Bad Request") from e
    for path in ignored:
        _note_ignored_field(path, metrics)
    # As vLLM: the X-Request-Id header names the request, else the body's request_id, else a new id.
    if header_request_id is not None:
        req.request_id = header_request_id
    elif req.request_id is msgspec.UNSET:
        req.request_id = random_uuid()
    forbid_unreadable_request_id(req.request_id)
    forbid_invalid_cache_salt(req.cache_salt)  # before the model check, as vLLM's before-validator
    return req


_ignored_seen: set[str] = set()


def _note_ignored_field(path: str, metrics: Metrics) -> None:
    """Visible, not fatal: a counter per field, and one log line the first time a field is seen."""
    metrics.unknown_fields.labels(path).inc()
    if path not in _ignored_seen and len(_ignored_seen) < MAX_IGNORED_FIELDS:
        _ignored_seen.add(path)
        log.warning("ignoring the unknown request field %r (the sender is newer than this server?)", path)
