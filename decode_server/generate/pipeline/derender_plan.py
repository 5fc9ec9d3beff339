"""What the derender stage needs per request: the parser class and the chat context.

`Derenderer` is server-wide (vLLM's parser class, resolved once); `plan()` turns a
request's `parse_context` (vLLM 0.33's wire) or `chat_request` (the RFC's) into the
`ChatCompletionRequest` vLLM's parsers read, and builds one parser per choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgspec
from pydantic import TypeAdapter, ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    ChatCompletionToolsParam,
)
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.exceptions import VLLMValidationError
from vllm.parser import ParserManager
from vllm.renderers.chat_utils import get_tool_call_id_type

from decode_server.compat import SET_HISTORY_TOOL_CALL_COUNT, VLLM_DERENDER_WITHOUT_CONTEXT, vllm_batch_derenderer
from decode_server.config import DerenderConfig
from decode_server.errors import Rejected
from protocol.chat import ParseContext

_tools_adapter = TypeAdapter(list[ChatCompletionToolsParam])
_tool_choice_adapter = TypeAdapter(ChatCompletionNamedToolChoiceParam)


def compose_parser(config: DerenderConfig, tokenizer: Any, model_name: str, model_type: str | None) -> Any:
    """vLLM's parser class for these flags, as `vllm serve`'s chat serving composes it (a gpt_oss
    model is harmony whatever the flags), checked against `tokenizer`: a TypeError that names the
    flag, the parser and what the tokenizer lacks when it cannot work with it."""
    return ParserManager.get_parser(
        tool_parser_name=config.tool_call_parser,
        reasoning_parser_name=config.reasoning_parser,
        enable_auto_tools=config.enable_auto_tool_choice,
        model_name=model_name,
        is_harmony=model_type == "gpt_oss",
        tokenizer=tokenizer,
    )


class Derenderer:
    """Server-wide: the parser class (resolved once) and what every request's parsers share."""

    def __init__(self, config: DerenderConfig, tokenizer: Any, model_config: Any, renderer: Any = None):
        self.config = config
        self.tokenizer = tokenizer
        self.model_config = model_config
        # Where the running vLLM serves batch derender itself (0.33), its derenderer: it reads
        # parse_context and assembles batch messages; None: ours does (0.32).
        self.vllm = vllm_batch_derenderer(model_config, renderer, config)

    @cached_property
    def parser_cls(self) -> Any:
        if self.tokenizer is None:
            return None
        model_type = getattr(self.model_config.hf_config, "model_type", None)
        return compose_parser(self.config, self.tokenizer, self.model_config.model, model_type)

    @cached_property
    def tool_call_id_type(self) -> str:
        return get_tool_call_id_type(self.model_config)

    def plan(
        self, parse_context: dict[str, Any] | None, chat_request: dict[str, Any] | None, structured_outputs: Any = None
    ) -> DerenderPlan:
        """`structured_outputs`: the constraint the render installed on the sampling params (vLLM's
        StructuredOutputsParams), which coupled chat's parsers read on their request."""
        plan = self._plan(parse_context, chat_request)
        if plan.request is not None and structured_outputs is not None:
            # Coupled chat hands its parsers the request its parser's adjust_request constrained; some
            # stream differently under a grammar (hy_v4: a structural tag lets its markers arrive split
            # into sub-word tokens). Neither parse_context nor 0.33's to_chat_request carries it.
            plan.request.structured_outputs = structured_outputs
        return plan

    def _plan(self, parse_context: dict[str, Any] | None, chat_request: dict[str, Any] | None) -> DerenderPlan:
        if self.parser_cls is None:
            return DerenderPlan(self, None, 0)
        if parse_context is None and chat_request is None and self.vllm is not None:
            raise Rejected(VLLM_DERENDER_WITHOUT_CONTEXT, param=None, reason="derender_without_context")
        if parse_context is None and chat_request is None:
            raise Rejected(
                "output_mode='derender' on a server with a reasoning or tool parser needs parse_context "
                "(or chat_request) from /render; without it the parser cannot tell how the prompt left "
                "reasoning and tools, and <think>/<tool_call> markup would leak into content",
                param="parse_context",
                reason="derender_without_context",
            )
        if chat_request is not None:
            try:
                request = ChatCompletionRequest.model_validate(chat_request)
            except ValidationError as e:
                raise Rejected(f"invalid chat_request: {e}", param="chat_request", reason="invalid_chat_request") from e
            return DerenderPlan(self, request, 0)
        if self.vllm is not None:
            return DerenderPlan(self, _vllm_chat_request(parse_context or {}), _history_count(parse_context))
        return DerenderPlan(self, _chat_request_from_parse_context(parse_context or {}), _history_count(parse_context))


def _history_count(parse_context: dict[str, Any] | None) -> int:
    return int((parse_context or {}).get("history_tool_call_cnt") or 0)


def _vllm_chat_request(raw: dict[str, Any]) -> ChatCompletionRequest:
    """vLLM's own reading of a parse_context (admission has let vLLM validate it)."""
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import ParseContext as VllmParseContext

    try:
        return VllmParseContext.model_validate(raw).to_chat_request()
    except VLLMValidationError as e:
        info = create_error_response(e).error
        raise Rejected(info.message, param=info.param, reason="unknown_named_tool", error_type=info.type) from e


def _chat_request_from_parse_context(raw: dict[str, Any]) -> ChatCompletionRequest:
    try:
        ctx = msgspec.convert(raw, ParseContext)
    except msgspec.ValidationError as e:
        message = str(e)
        if message.startswith("Object contains unknown field"):
            message = f"parse_context: {message}; the render server is newer than this decode server"
        else:
            message = f"invalid parse_context: {message}"
        raise Rejected(message, param="parse_context", reason="invalid_parse_context") from e
    try:
        tools = None if ctx.tools is None else _tools_adapter.validate_python(ctx.tools)
        tool_choice: Any = ctx.tool_choice
        if isinstance(tool_choice, dict):
            tool_choice = _tool_choice_adapter.validate_python(tool_choice)
    except ValidationError as e:
        raise Rejected(f"invalid parse_context: {e}", param="parse_context", reason="invalid_parse_context") from e
    # vLLM 0.33's ParseContext: no tool_choice means "none" (the render tier always sends
    # the one the chat request resolved to).
    if isinstance(tool_choice, ChatCompletionNamedToolChoiceParam):
        name = tool_choice.function.name
        if not any(tool.function.name == name for tool in tools or ()):
            raise Rejected(
                f"tool_choice names the tool {name!r}, which is not among parse_context.tools",
                param="parse_context.tool_choice",
                reason="unknown_named_tool",
            )
    # Built without the chat validators, as vLLM 0.33's ParseContext.to_chat_request does:
    # the parsers read only these fields.
    values = {
        "messages": [],
        "tools": tools,
        "tool_choice": tool_choice if tool_choice is not None else "none",
        "parallel_tool_calls": ctx.parallel_tool_calls,
        "include_reasoning": ctx.include_reasoning,
        "chat_template_kwargs": ctx.chat_template_kwargs or {},
    }
    return ChatCompletionRequest.model_construct(set(values), **values, **{name: make() for name, make in _FACTORIES})


# The request's default factories, called here: pydantic's model_construct asks of each factory
# it calls whether it takes the validated data (inspect.signature on a builtin parses its text
# signature), ~0.3 ms per derender request; given their values it asks nothing, and the fields
# set stays the caller's.
_FACTORIES = [(name, f.default_factory) for name, f in ChatCompletionRequest.model_fields.items() if f.default_factory is not None]


@dataclass
class DerenderPlan:
    derenderer: Derenderer
    request: ChatCompletionRequest | None  # None: no parser, text is content
    history_tool_call_cnt: int

    @property
    def role(self) -> str:
        return self.derenderer.config.response_role

    @property
    def hides_reasoning(self) -> bool:
        return self.request is not None and self.request.include_reasoning is False

    @property
    def named_tool_choice(self) -> bool:
        return self.request is not None and type(self.request.tool_choice) is ChatCompletionNamedToolChoiceParam

    def request_under_server_defaults(self) -> ChatCompletionRequest | None:
        """The request with --default-chat-template-kwargs under its own chat_template_kwargs, as
        coupled chat builds its parser (0.33's batch derender reads the request's alone)."""
        defaults = self.derenderer.config.default_chat_template_kwargs
        if self.request is None or not defaults:
            return self.request
        return self.request.model_copy(update={"chat_template_kwargs": _under_defaults(self.request, defaults)})

    def new_parser(self) -> Any:
        d = self.derenderer
        req = self.request
        parser = d.parser_cls(
            d.tokenizer,
            req.tools,
            chat_template_kwargs=_effective_template_kwargs(req, d.config.default_chat_template_kwargs),
            model_config=d.model_config,
        )
        if self.history_tool_call_cnt:
            SET_HISTORY_TOOL_CALL_COUNT(parser, self.history_tool_call_cnt)
        return parser


def _under_defaults(req: ChatCompletionRequest, defaults: dict[str, Any]) -> dict[str, Any]:
    # --default-chat-template-kwargs sit under the request's own, as vLLM renders them.
    return {**defaults, **(req.chat_template_kwargs or {})}


def _effective_template_kwargs(req: ChatCompletionRequest, defaults: dict[str, Any]) -> dict[str, Any]:
    kwargs = _under_defaults(req, defaults)
    effort = getattr(req, "reasoning_effort", None)
    if effort is not None and "enable_thinking" not in kwargs:
        kwargs["enable_thinking"] = effort != "none"
    return kwargs
