"""`POST /inference/v1/generate`: the request and every response and stream chunk.

Field names, defaults and nullability follow vLLM 0.32's pydantic models in
`vllm/entrypoints/scale_out/token_in_token_out/protocol.py`, so a vLLM client
parses our JSON unchanged. Fields vLLM always writes (even as null) have no
default here, so `omit_defaults` never drops them; fields vLLM drops when empty
default to None.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal, NamedTuple

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from protocol.chat import ChatLogProbs, ChatMessage, DeltaMessage, ParseContext

OutputMode = Literal["tokens", "text", "derender"]

# The request's id: as vLLM, the caller's header names the request; every response echoes it.
REQUEST_ID_HEADER = "x-request-id"
# The parser fingerprint a render tier rendered for (request), and the server's (every response).
FINGERPRINT_HEADER = "x-parser-fingerprint"

NonNegativeInt = Annotated[int, Meta(ge=0)]


class StructuredOutputs(Struct):
    """Unknown keys are dropped: vLLM's /render serializes private ones (`_backend`)."""

    json: str | dict[str, Any] | None | UnsetType = UNSET
    regex: str | None | UnsetType = UNSET
    choice: list[str] | None | UnsetType = UNSET
    grammar: str | None | UnsetType = UNSET
    json_object: bool | None | UnsetType = UNSET
    disable_any_whitespace: bool | UnsetType = UNSET
    disable_additional_properties: bool | UnsetType = UNSET
    whitespace_pattern: str | None | UnsetType = UNSET
    structural_tag: str | None | UnsetType = UNSET


class RepetitionDetection(Struct, forbid_unknown_fields=True):
    max_pattern_size: int | UnsetType = UNSET
    min_pattern_size: int | UnsetType = UNSET
    min_count: int | UnsetType = UNSET


class SamplingParams(Struct, forbid_unknown_fields=True):
    """Every public field of vLLM's SamplingParams.

    Each defaults to UNSET so the server knows which keys the caller wrote
    (max_tokens is defaulted from the model only when absent, as vLLM does);
    values are checked by vLLM's own SamplingParams when the request is built.
    """

    n: int | None | UnsetType = UNSET
    presence_penalty: float | None | UnsetType = UNSET
    frequency_penalty: float | None | UnsetType = UNSET
    repetition_penalty: float | None | UnsetType = UNSET
    temperature: float | None | UnsetType = UNSET
    watermarking: bool | None | UnsetType = UNSET
    top_p: float | None | UnsetType = UNSET
    top_k: int | None | UnsetType = UNSET
    min_p: float | None | UnsetType = UNSET
    seed: int | None | UnsetType = UNSET
    stop: str | list[str] | None | UnsetType = UNSET
    stop_token_ids: list[int] | None | UnsetType = UNSET
    ignore_eos: bool | UnsetType = UNSET
    max_tokens: int | None | UnsetType = UNSET
    min_tokens: int | UnsetType = UNSET
    logprobs: int | None | UnsetType = UNSET
    prompt_logprobs: int | None | UnsetType = UNSET
    prompt_logprob_token_ids: list[list[int]] | None | UnsetType = UNSET
    prompt_logprob_start: int | None | UnsetType = UNSET
    logprob_token_ids: list[int] | None | UnsetType = UNSET
    flat_logprobs: bool | UnsetType = UNSET
    detokenize: bool | UnsetType = UNSET
    skip_special_tokens: bool | UnsetType = UNSET
    spaces_between_special_tokens: bool | UnsetType = UNSET
    include_stop_str_in_output: bool | UnsetType = UNSET
    output_kind: int | UnsetType = UNSET
    stream_interval: int | None | UnsetType = UNSET
    skip_clone: bool | UnsetType = UNSET
    output_text_buffer_length: int | UnsetType = UNSET
    structured_outputs: StructuredOutputs | None | UnsetType = UNSET
    logit_bias: dict[str, float] | None | UnsetType = UNSET
    allowed_token_ids: list[int] | None | UnsetType = UNSET
    extra_args: dict[str, Any] | None | UnsetType = UNSET
    bad_words: list[str] | None | UnsetType = UNSET
    skip_reading_prefix_cache: bool | None | UnsetType = UNSET
    thinking_token_budget: int | None | UnsetType = UNSET
    repetition_detection: RepetitionDetection | None | UnsetType = UNSET
    routed_experts_prompt_start: int | UnsetType = UNSET
    trace_decode_token_ids: list[int] | None | UnsetType = UNSET

    def provided(self) -> dict[str, Any]:
        """The keys the caller set, as plain JSON values."""
        return msgspec.to_builtins(self)


class StreamOptions(Struct):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class PlaceholderRange(Struct):
    offset: NonNegativeInt
    length: Annotated[int, Meta(gt=0)]


class MultiModalFeatures(Struct):
    mm_hashes: dict[str, list[str]]
    mm_placeholders: dict[str, list[PlaceholderRange]]
    kwargs_data: dict[str, list[str | None]] | None = None
    mm_metadata: dict[str, list[str | None]] | None = None


class ReasoningParserKwargs(Struct, forbid_unknown_fields=True):
    chat_template_kwargs: dict[str, Any] = {}


def new_request_id() -> str:
    return uuid.uuid4().hex


class GenerateRequest(Struct):
    token_ids: Annotated[list[NonNegativeInt], Meta(min_length=1)]
    sampling_params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    # UNSET until the server fills it: from an X-Request-Id header, else a new id.
    request_id: str | UnsetType = UNSET
    token_offsets: list[tuple[int, int]] | None = None
    features: MultiModalFeatures | None = None
    content_parts: list[dict[str, Any]] | None = None
    model: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: ReasoningParserKwargs | None = None
    return_token_ids: bool | None = None
    output_mode: OutputMode = "tokens"
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # Checked by the server with vLLM's own rule (and message), before any schema error.
    cache_salt: Any = None
    priority: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] = 0
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    # Derender level: the chat context the parsers need. `parse_context` is
    # vLLM 0.33's wire; `chat_request` is the RFC's (a ChatCompletionRequest).
    # Both are kept raw here and read only at the derender level, so a rendered
    # request can go to a prefill leg unchanged.
    parse_context: dict[str, Any] | None = None
    chat_request: dict[str, Any] | None = None


# ---------------------------------------------------------------- responses


class PromptTokenUsage(Struct):
    cached_tokens: int | None = None


class Usage(Struct):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int | None
    prompt_tokens_details: PromptTokenUsage | None = None
    completion_tokens_details: dict[str, Any] | None = None


class FinalStreamUsage(Usage, omit_defaults=True):
    """The usage chunk: vLLM writes it with exclude_none."""


class GenerateLogProb(Struct):
    token_id: int
    logprob: float
    rank: int | None = None


class GenerateLogProbsContent(Struct):
    token_id: int
    logprob: float
    rank: int | None = None
    top_logprobs: list[GenerateLogProb] = []


class GenerateLogProbs(Struct):
    content: list[GenerateLogProbsContent] | None


class _Choice(Struct, kw_only=True):
    index: int
    finish_reason: str | None
    stop_reason: int | str | None
    token_ids: list[int] | None
    routed_experts: str | None = None
    sampling_mask: list[list[int]] | None = None
    weight_versions: list[Any] | None = None


class TokensChoice(_Choice, kw_only=True):
    logprobs: GenerateLogProbs | None


class TextChoice(_Choice, kw_only=True):
    text: str
    logprobs: ChatLogProbs | None


class DerenderChoice(_Choice, kw_only=True):
    message: ChatMessage
    logprobs: ChatLogProbs | None


class DerenderStreamChoice(_Choice, kw_only=True):
    delta: DeltaMessage
    logprobs: ChatLogProbs | None


class _Response(Struct, kw_only=True):
    request_id: str
    model: str | None
    created: int | None
    usage: Usage | None
    prompt_logprobs: list[Any] | None = None
    prompt_token_id_logprobs: str | None = None
    prompt_token_ids: list[int] | None = None
    mm_placeholders: dict[str, list[PlaceholderRange]] | None = None
    metrics: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None


class GenerateTokensResponse(_Response, kw_only=True):
    output_mode: Literal["tokens"] = "tokens"
    choices: list[TokensChoice]


class GenerateTextResponse(_Response, kw_only=True):
    output_mode: Literal["text"] = "text"
    choices: list[TextChoice]


class GenerateDerenderResponse(_Response, kw_only=True):
    output_mode: Literal["derender"] = "derender"
    choices: list[DerenderChoice]


# Stream chunks drop prompt_token_ids/mm_placeholders/metrics when absent, as
# vLLM does (`exclude={...}` on token-bearing chunks); everything else is written.
class _StreamChunk(Struct, kw_only=True, omit_defaults=True):
    request_id: str
    usage: Usage | None
    prompt_token_ids: list[int] | None = None
    mm_placeholders: dict[str, list[PlaceholderRange]] | None = None
    metrics: dict[str, Any] | None = None


class GenerateTokensStreamResponse(_StreamChunk, kw_only=True):
    output_mode: str  # required, so omit_defaults never drops it
    choices: list[TokensChoice]


class GenerateTextStreamResponse(_StreamChunk, kw_only=True):
    output_mode: str  # required, so omit_defaults never drops it
    choices: list[TextChoice]


class GenerateDerenderStreamResponse(_StreamChunk, kw_only=True):
    output_mode: str  # required, so omit_defaults never drops it
    choices: list[DerenderStreamChoice]


class UsageChunk(Struct, kw_only=True, omit_defaults=True):
    """The last chunk when stream_options.include_usage is set: no choices."""

    request_id: str
    usage: FinalStreamUsage
    output_mode: str
    choices: list[Any]
    metrics: dict[str, Any] | None = None


class ModeTypes(NamedTuple):
    """The wire classes of one output mode."""

    response: type  # the batch body
    chunk: type  # one stream chunk
    choice: type  # a batch choice
    stream_choice: type  # a stream chunk's choice


# The one output_mode → classes table (server, clients, OpenAPI all read it).
MODE_TYPES: dict[str, ModeTypes] = {
    "tokens": ModeTypes(GenerateTokensResponse, GenerateTokensStreamResponse, TokensChoice, TokensChoice),
    "text": ModeTypes(GenerateTextResponse, GenerateTextStreamResponse, TextChoice, TextChoice),
    "derender": ModeTypes(GenerateDerenderResponse, GenerateDerenderStreamResponse, DerenderChoice, DerenderStreamChoice),
}


# ---------------------------------------------------------------- abort


class AbortRequest(Struct):
    request_ids: list[str]


__all__ = [
    "FINGERPRINT_HEADER",
    "REQUEST_ID_HEADER",
    "AbortRequest",
    "GenerateRequest",
    "GenerateTokensResponse",
    "GenerateTextResponse",
    "GenerateDerenderResponse",
    "GenerateTokensStreamResponse",
    "GenerateTextStreamResponse",
    "GenerateDerenderStreamResponse",
    "MODE_TYPES",
    "ParseContext",
    "SamplingParams",
    "UsageChunk",
]
