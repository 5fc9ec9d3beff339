"""Stage 3 (derender level): one vLLM Parser per choice → assistant message (batch) or deltas (stream).

The parser is vLLM's own (`ParserManager.get_parser`, reasoning + tool parser),
built per choice exactly as coupled `/v1/chat/completions` builds it, fed each
engine delta once (stream) or the engine's final, stop-cut text once (batch),
and dropped with the generator. Message assembly and finish_reason follow
coupled chat (`vllm/entrypoints/openai/chat_completion/serving.py`), the
parity oracle; docs/vllm-derender-notes.md has the line references.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgspec
from pydantic import TypeAdapter, ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    ChatCompletionToolsParam,
)
from vllm.entrypoints.serve.utils.tool_calls_utils import maybe_filter_parallel_tool_calls
from vllm.parser import ParserManager
from vllm.renderers.chat_utils import get_tool_call_id_type, make_tool_call_id

from decode_server.pipeline.tokens import ChoiceStep, Step
from decode_server.validate import Rejected
from protocol.chat import (
    ChatMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ParseContext,
    ToolCall,
)

_tools_adapter = TypeAdapter(list[ChatCompletionToolsParam])
_tool_choice_adapter = TypeAdapter(ChatCompletionNamedToolChoiceParam)
ROLE = "assistant"


@dataclass(frozen=True)
class DerenderConfig:
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False


class Derenderer:
    """Server-wide: the parser class (resolved once) and what every request's parsers share."""

    def __init__(self, config: DerenderConfig, tokenizer: Any, model_config: Any):
        self.config = config
        self.tokenizer = tokenizer
        self.model_config = model_config

    @cached_property
    def parser_cls(self) -> Any:
        if self.tokenizer is None:
            return None
        return ParserManager.get_parser(
            tool_parser_name=self.config.tool_call_parser,
            reasoning_parser_name=self.config.reasoning_parser,
            enable_auto_tools=self.config.enable_auto_tool_choice,
            model_name=self.model_config.model,
            is_harmony=getattr(self.model_config.hf_config, "model_type", None) == "gpt_oss",
            tokenizer=self.tokenizer,
        )

    @cached_property
    def tool_call_id_type(self) -> str:
        return get_tool_call_id_type(self.model_config)

    def plan(self, parse_context: dict[str, Any] | None, chat_request: dict[str, Any] | None) -> DerenderPlan:
        if self.parser_cls is None:
            return DerenderPlan(self, None, 0)
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
        return DerenderPlan(self, _chat_request_from_parse_context(parse_context or {}), _history_count(parse_context))


def _history_count(parse_context: dict[str, Any] | None) -> int:
    return int((parse_context or {}).get("history_tool_call_cnt") or 0)


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
    if tool_choice is None and tools:
        tool_choice = "auto"
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
    return ChatCompletionRequest.model_construct(
        messages=[],
        tools=tools,
        tool_choice=tool_choice if tool_choice is not None else "none",
        parallel_tool_calls=ctx.parallel_tool_calls,
        include_reasoning=ctx.include_reasoning,
        chat_template_kwargs=ctx.chat_template_kwargs or {},
    )


@dataclass
class DerenderPlan:
    derenderer: Derenderer
    request: ChatCompletionRequest | None  # None: no parser, text is content
    history_tool_call_cnt: int

    @property
    def hides_reasoning(self) -> bool:
        return self.request is not None and self.request.include_reasoning is False

    @property
    def named_tool_choice(self) -> bool:
        return self.request is not None and type(self.request.tool_choice) is ChatCompletionNamedToolChoiceParam

    def new_parser(self) -> Any:
        d = self.derenderer
        req = self.request
        parser = d.parser_cls(
            d.tokenizer,
            req.tools,
            chat_template_kwargs=_effective_template_kwargs(req),
            model_config=d.model_config,
        )
        if self.history_tool_call_cnt:
            # vLLM 0.32 only counts history from request.messages (empty here); 0.33 has a setter.
            setter = getattr(parser, "set_history_tool_call_count", None)
            if setter is not None:
                setter(self.history_tool_call_cnt)
            else:
                parser._stream_state.history_tool_call_cnt = self.history_tool_call_cnt
                parser._stream_state.history_tool_call_cnt_initialized = True
        return parser


def _effective_template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    kwargs = dict(req.chat_template_kwargs or {})
    effort = getattr(req, "reasoning_effort", None)
    if effort is not None and "enable_thinking" not in kwargs:
        kwargs["enable_thinking"] = effort != "none"
    return kwargs


# ------------------------------------------------------------------ shapes


def _wire_delta(dm: Any) -> DeltaMessage:
    return DeltaMessage(
        role=dm.role,
        content=dm.content,
        reasoning=dm.reasoning,
        tool_calls=[
            DeltaToolCall(
                index=tc.index,
                id=tc.id,
                type=tc.type,
                function=None
                if tc.function is None
                else DeltaFunctionCall(name=tc.function.name, arguments=tc.function.arguments),
            )
            for tc in dm.tool_calls
        ],
    )


_EMPTY_DELTA = DeltaMessage()


@dataclass
class _ChoiceState:
    parser: Any
    started: bool = False
    tools_streamed: bool = False
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


def _hide_metadata(c: ChoiceStep) -> None:
    # Reasoning token ids and logprobs would reveal hidden reasoning (as coupled chat hides them).
    c.hide_metadata = True


async def derender_stream(steps: AsyncIterator[Step], plan: DerenderPlan, prompt_token_ids: list[int], n: int) -> AsyncIterator[Step]:
    """Streaming: parse_delta per engine delta; a role-only chunk opens each choice."""
    if plan.request is None:
        async for step in _plain(steps, stream=True):
            yield step
        return
    states = [_ChoiceState(plan.new_parser()) for _ in range(n)]
    req = plan.request
    try:
        async for step in steps:
            choices: list[ChoiceStep] = []
            for c in step.choices:
                st = states[c.index]
                if not st.started:
                    st.started = True
                    choices.append(_role_step(c.index))
                finished = c.finish_reason is not None
                dm = st.parser.parse_delta(
                    delta_text=c.text,
                    delta_token_ids=c.token_ids,
                    request=req,
                    prompt_token_ids=prompt_token_ids,
                    finished=finished,
                )
                if dm is not None:
                    dm = maybe_filter_parallel_tool_calls(dm, req)
                    if dm.tool_calls:
                        st.tools_streamed = True
                c.delta = _wire_delta(dm) if dm is not None else _EMPTY_DELTA
                if finished and st.tools_streamed and not plan.named_tool_choice and c.finish_reason == "stop":
                    c.finish_reason = "tool_calls"
                if plan.hides_reasoning:
                    _hide_metadata(c)
                choices.append(c)
            step.choices = choices
            yield step
    finally:
        states.clear()


async def derender_batch(steps: AsyncIterator[Step], plan: DerenderPlan, n: int) -> AsyncIterator[Step]:
    """Batch: the engine's final text, parsed once per choice when it finishes."""
    if plan.request is None:
        async for step in _plain(steps, stream=False):
            yield step
        return
    states: dict[int, _ChoiceState] = {}
    try:
        async for step in steps:
            for c in step.choices:
                st = states.get(c.index)
                if st is None:
                    st = states[c.index] = _ChoiceState(plan.new_parser())
                st.text.append(c.text)
                st.token_ids.extend(c.token_ids)
                if c.finish_reason is not None:
                    c.message, c.finish_reason = _assemble_message(plan, st, c.finish_reason)
                if plan.hides_reasoning:
                    _hide_metadata(c)
            yield step
    finally:
        states.clear()


def _role_step(index: int) -> ChoiceStep:
    return ChoiceStep(
        index=index, token_ids=[], finish_reason=None, stop_reason=None, text="", raw_logprobs=None, extras={},
        delta=DeltaMessage(role=ROLE, content=""),
    )


async def _plain(steps: AsyncIterator[Step], stream: bool) -> AsyncIterator[Step]:
    """No parser configured: the text is the content."""
    started: set[int] = set()
    texts: dict[int, list[str]] = {}
    async for step in steps:
        for c in step.choices:
            if stream:
                if c.index not in started:
                    started.add(c.index)
                    c.delta = DeltaMessage(role=ROLE, content=c.text)
                else:
                    c.delta = DeltaMessage(content=c.text) if c.text else _EMPTY_DELTA
            else:
                texts.setdefault(c.index, []).append(c.text)
                if c.finish_reason is not None:
                    c.message = ChatMessage(role=ROLE, content="".join(texts.pop(c.index)))
        yield step


def _assemble_message(plan: DerenderPlan, st: _ChoiceState, engine_finish: str) -> tuple[ChatMessage, str]:
    """ChatMessage and finish_reason exactly as coupled chat's non-streaming path builds them."""
    d = plan.derenderer
    req = plan.request
    reasoning, content, calls = st.parser.parse(
        "".join(st.text), req, enable_auto_tools=d.config.enable_auto_tool_choice, model_output_token_ids=st.token_ids
    )
    if not req.include_reasoning:
        reasoning = None
    named = plan.named_tool_choice
    required = req.tool_choice == "required"
    auto_tools_called = False
    tool_calls: list[Any] = []
    has_tool_parser = d.config.enable_auto_tool_choice and d.config.tool_call_parser is not None
    if not has_tool_parser and not (named or required):
        pass
    elif named or required:
        content = content or ""
        tool_calls = list(calls or [])
    elif not req.tool_choice or req.tool_choice == "none":
        pass
    elif req.tools and req.tool_choice in ("auto", None):
        auto_tools_called = bool(calls)
        tool_calls = list(calls or [])
    if req.parallel_tool_calls is False:
        tool_calls = tool_calls[:1]
    message = ChatMessage(
        role=ROLE,
        content=content,
        reasoning=reasoning,
        tool_calls=[
            ToolCall(id=tc.id or _new_tool_call_id(d, plan, i), function=FunctionCall(name=tc.name, arguments=tc.arguments))
            for i, tc in enumerate(tool_calls)
        ],
    )
    finish = "tool_calls" if auto_tools_called or (required and engine_finish == "stop") else engine_finish
    return message, finish


def _new_tool_call_id(d: Derenderer, plan: DerenderPlan, i: int) -> str:
    if d.tool_call_id_type == "random":
        return make_tool_call_id()
    return make_tool_call_id(d.tool_call_id_type, None, plan.history_tool_call_cnt + i)
