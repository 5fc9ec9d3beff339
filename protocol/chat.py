"""Chat-shaped pieces of the wire, mirrored from vLLM's OpenAI protocol models.

Logprobs with decoded strings (text and derender levels), the assistant message
(derender batch), the delta message (derender stream) and the parse context.
"""

from __future__ import annotations

from typing import Any

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


class ChatMessage(Struct, omit_defaults=True):
    """vLLM's ChatMessage as it serializes: `tool_calls` only when non-empty."""

    role: str
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = []


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
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    history_tool_call_cnt: int = 0
