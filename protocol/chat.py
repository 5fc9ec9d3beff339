"""Chat-shaped pieces of the wire, mirrored from vLLM's OpenAI protocol models.

Logprobs with decoded strings (text and derender levels), the assistant message
(derender batch), the delta message (derender stream) and the parse context.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct


class ChatLogProb(Struct):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatLogProbsContent(Struct):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None
    top_logprobs: list[ChatLogProb] = []


class ChatLogProbs(Struct):
    content: list[ChatLogProbsContent] | None


class FunctionCall(Struct):
    name: str
    arguments: str


class ToolCall(Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class ChatMessage(Struct, omit_defaults=True, kw_only=True):
    """vLLM's ChatMessage as it serializes: every key, nulls included, but `tool_calls` only
    when non-empty (the fields without a default are never omitted)."""

    role: str
    content: str | None
    refusal: str | None
    annotations: Any
    audio: Any
    function_call: Any
    tool_calls: list[ToolCall] = []
    reasoning: str | None


def assistant_message(
    role: str, content: str | None, reasoning: str | None = None, tool_calls: list[ToolCall] | None = None
) -> ChatMessage:
    """A ChatMessage with the fields vLLM never fills here (refusal, audio, …) null."""
    return ChatMessage(
        role=role, content=content, refusal=None, annotations=None, audio=None, function_call=None,
        tool_calls=tool_calls or [], reasoning=reasoning,
    )


class DeltaFunctionCall(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(Struct, omit_defaults=True):
    """vLLM's DeltaMessage as its chat stream writes it (only the set fields)."""

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] = []


class ParseContext(Struct, forbid_unknown_fields=True):
    """vLLM 0.33's ParseContext: what the parsers need from the chat request.

    Unknown fields are an error at the derender level: they mean the render
    server is newer than this one and may expect parsing we do not do.
    """

    tools: list[dict[str, Any]] | None = None
    # As vLLM 0.33: one of the three modes or a named function; absent means "none".
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    history_tool_call_cnt: int = 0
