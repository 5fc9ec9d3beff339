"""Stage 3 (derender level): one vLLM Parser per choice → assistant message (batch) or deltas (stream).

The parser is vLLM's own (`ParserManager.get_parser`, reasoning + tool parser),
built per choice exactly as coupled `/v1/chat/completions` builds it, fed each
token's delta once (stream: a merged engine step is cut per token and what its
pieces produce goes out as one delta, token_text_ends.py) or the engine's final,
stop-cut text once (batch), and dropped with the stream's stage. Message assembly and finish_reason follow
coupled chat (`vllm/entrypoints/openai/chat_completion/serving.py`), the
parity oracle; docs/vllm-derender-notes.md has the line references.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from vllm.entrypoints.serve.utils.tool_calls_utils import maybe_filter_parallel_tool_calls
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.sampling_params import SamplingParams

from decode_server.generate.pipeline.delta_merge import merge_deltas
from decode_server.generate.pipeline.derender_plan import DerenderPlan
from decode_server.generate.pipeline.parser_errors import parser_failed
from decode_server.generate.pipeline.steps import ChoiceStep, Step, each, role_step
from decode_server.generate.pipeline.token_aligned_text import TokenAlignedText, holds_text_back
from decode_server.generate.pipeline.token_text_ends import MergedSteps, Piece
from protocol.chat import ChatMessage, DeltaMessage, FunctionCall, ToolCall, assistant_message

# ------------------------------------------------------------------ shapes


def _set_fields(model: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(model, name) for name in names if name in model.model_fields_set}


def _wire_delta(dm: Any) -> dict[str, Any]:
    """vLLM's DeltaMessage as coupled chat writes it (`exclude_unset`: a field the parser set to
    None is written as null; `tool_calls` only when non-empty), without pydantic on the hot path."""
    out = _set_fields(dm, ("role", "content", "reasoning"))
    if dm.tool_calls:
        calls = []
        for tc in dm.tool_calls:
            call = _set_fields(tc, ("id", "type", "index"))
            if "function" in tc.model_fields_set:
                fn = tc.function
                call["function"] = None if fn is None else _set_fields(fn, ("name", "arguments"))
            calls.append(call)
        out["tool_calls"] = calls
    return out


_EMPTY_DELTA = DeltaMessage()


@dataclass(slots=True)
class _StreamState:
    parser: Any
    # Where stop strings hold the engine's text back, the aligner; else the per-token cutter.
    split: TokenAlignedText | MergedSteps
    tools_streamed: bool = False


def derender_stream(
    steps: AsyncIterator[Step], plan: DerenderPlan, prompt_token_ids: list[int], sp: SamplingParams
) -> AsyncIterator[Step]:
    """`stream_derender` over an async source (tests, the derender bench)."""
    return each(steps, stream_derender(plan, prompt_token_ids, sp))


def stream_derender(plan: DerenderPlan, prompt_token_ids: list[int], sp: SamplingParams) -> Callable[[Step], None]:
    """The derender stage of one stream, a plain call per engine step: parse_delta per token, one
    delta per engine output; a role-only chunk opens each choice."""
    if plan.request is None:
        return _PlainStream(plan)
    return _ParsedStream(plan, prompt_token_ids, sp)


class _ParsedStream:
    __slots__ = ("_plan", "_prompt_token_ids", "_sp", "_align", "_states")

    def __init__(self, plan: DerenderPlan, prompt_token_ids: list[int], sp: SamplingParams):
        self._plan, self._prompt_token_ids, self._sp = plan, prompt_token_ids, sp
        self._align = holds_text_back(sp)
        self._states: dict[int, _StreamState] = {}

    def __call__(self, step: Step) -> None:
        plan, states = self._plan, self._states
        choices: list[ChoiceStep] = []
        for c in step.choices:
            st = states.get(c.index)
            if st is None:
                split = (TokenAlignedText if self._align else MergedSteps)(plan.derenderer.tokenizer, self._prompt_token_ids, self._sp)
                st = states[c.index] = _StreamState(_new_parser(plan), split)
                choices.append(role_step(c.index, DeltaMessage(role=plan.role, content="")))
            _parse_delta(plan, st, c, self._prompt_token_ids)
            choices.append(c)
        step.choices = choices


def _parse_delta(plan: DerenderPlan, st: _StreamState, c: ChoiceStep, prompt_token_ids: list[int]) -> None:
    finished = c.finish_reason is not None
    split = st.split
    if type(split) is MergedSteps:
        pieces = split.pieces(c.text, c.token_ids)
    else:
        pieces = split.step(c.text, c.token_ids, finished)
    if pieces is None:  # one id at most: parsed as it came (the hot path allocates nothing here)
        wire = _parsed(plan, st, c.text, c.token_ids, finished, prompt_token_ids)
    elif not pieces:  # every id of this step waits for its text: nothing for the parser yet
        wire = None
    elif len(pieces) == 1:
        wire = _parsed(plan, st, *pieces[0], finished, prompt_token_ids)
    else:
        wire = _parsed_pieces(plan, st, pieces, finished, prompt_token_ids)
    c.delta = _EMPTY_DELTA if wire is None else wire
    if finished and st.tools_streamed and not plan.named_tool_choice and c.finish_reason == "stop":
        c.finish_reason = "tool_calls"
    if plan.hides_reasoning:
        c.withhold_metadata()
        # Coupled chat sends nothing for a step the parser kept back when it hides reasoning
        # (an empty chunk per hidden step would tell how long the reasoning was).
        c.emit = wire is not None or finished


def _parsed(
    plan: DerenderPlan, st: _StreamState, text: str, token_ids: list[int], finished: bool, prompt_token_ids: list[int]
) -> dict[str, Any] | None:
    """One parse_delta call: the parser's delta as coupled chat writes it, or None when it kept
    everything back."""
    req = plan.request
    try:
        dm = st.parser.parse_delta(
            delta_text=text, delta_token_ids=token_ids, request=req, prompt_token_ids=prompt_token_ids, finished=finished
        )
    except Exception as e:  # the stream ends with vLLM's status for it as its error event
        raise parser_failed(e, plan.derenderer.config) from e
    if dm is None:
        return None
    dm = maybe_filter_parallel_tool_calls(dm, req)
    if dm.tool_calls:
        st.tools_streamed = True
    return _wire_delta(dm)


def _parsed_pieces(
    plan: DerenderPlan, st: _StreamState, pieces: list[Piece], finished: bool, prompt_token_ids: list[int]
) -> dict[str, Any] | None:
    """Each piece parsed in turn (only the last one can be the end), their deltas as one."""
    last = len(pieces) - 1
    deltas = []
    for k, (text, token_ids) in enumerate(pieces):
        wire = _parsed(plan, st, text, token_ids, finished and k == last, prompt_token_ids)
        if wire is not None:
            deltas.append(wire)
    if not deltas:
        return None
    return deltas[0] if len(deltas) == 1 else merge_deltas(deltas)


async def derender_batch(steps: AsyncIterator[Step], plan: DerenderPlan) -> AsyncIterator[Step]:
    """Batch: each choice's final, stop-cut text (one engine step, FINAL_ONLY) parsed once."""
    async for step in steps:
        for c in step.choices:
            if c.finish_reason is None:
                continue
            if plan.derenderer.vllm is not None:
                await _vllm_assembles(plan, step, c)
                continue
            if plan.request is None:
                c.message = assistant_message(plan.role, c.text)
                continue
            prompt_ids = step.output.prompt_token_ids
            c.message, c.finish_reason = _assemble_message(plan, c.text, c.token_ids or [], c.finish_reason, prompt_ids)
            if plan.hides_reasoning:
                c.withhold_metadata()
        yield step


async def _vllm_assembles(plan: DerenderPlan, step: Step, c: ChoiceStep) -> None:
    """The running vLLM serves batch derender (0.33): its message and finish_reason, and as it
    does, no per-token metadata when the reasoning is hidden."""
    output = next(o for o in step.output.outputs if o.index == c.index)
    try:
        [(message, finish)] = await plan.derenderer.vllm.derender_text_choices(
            [output], plan.request_under_server_defaults(), plan.history_tool_call_cnt, step.output.prompt_token_ids
        )
    except Exception as e:  # vLLM's derenderer lets its parser's exceptions through, as coupled chat does
        raise parser_failed(e, plan.derenderer.config) from e
    calls = [ToolCall(id=tc.id, function=FunctionCall(name=tc.function.name, arguments=tc.function.arguments), type=tc.type)
             for tc in message.tool_calls]
    c.message = assistant_message(message.role, message.content, message.reasoning, calls)
    c.finish_reason = finish
    if plan.hides_reasoning:
        c.withhold_metadata()


class _PlainStream:
    """No parser configured: the text is the content, after a role-only chunk (as coupled chat)."""

    __slots__ = ("_role", "_started")

    def __init__(self, plan: DerenderPlan):
        self._role = plan.role
        self._started: set[int] = set()

    def __call__(self, step: Step) -> None:
        choices: list[ChoiceStep] = []
        for c in step.choices:
            if c.index not in self._started:
                self._started.add(c.index)
                choices.append(role_step(c.index, DeltaMessage(role=self._role, content="")))
            c.delta = DeltaMessage(content=c.text)
            choices.append(c)
        step.choices = choices


def _assemble_message(
    plan: DerenderPlan, text: str, token_ids: list[int], engine_finish: str, prompt_token_ids: list[int] | None
) -> tuple[ChatMessage, str]:
    """ChatMessage and finish_reason exactly as coupled chat's non-streaming path builds them."""
    d = plan.derenderer
    req = plan.request
    parser = _new_parser(plan)
    if prompt_token_ids is not None:
        parser.set_prompt_token_ids(prompt_token_ids)  # prompt-dependent parsers (hf) need it
    try:
        reasoning, content, calls = parser.parse(
            text, req, enable_auto_tools=d.config.enable_auto_tool_choice, model_output_token_ids=token_ids
        )
    except Exception as e:  # e.g. internlm's JSONDecodeError on a call cut by max_tokens
        raise parser_failed(e, d.config) from e
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
    message = assistant_message(
        plan.role,
        content,
        reasoning,
        [
            ToolCall(id=tc.id or _new_tool_call_id(d, plan, i), function=FunctionCall(name=tc.name, arguments=tc.arguments))
            for i, tc in enumerate(tool_calls)
        ],
    )
    finish = "tool_calls" if auto_tools_called or (required and engine_finish == "stop") else engine_finish
    return message, finish


def _new_parser(plan: DerenderPlan) -> Any:
    try:
        return plan.new_parser()
    except Exception as e:  # a parser that cannot be built for this request (its tools, its kwargs)
        raise parser_failed(e, plan.derenderer.config) from e


def _new_tool_call_id(d: Any, plan: DerenderPlan, i: int) -> str:
    if d.tool_call_id_type == "random":
        return make_tool_call_id()
    return make_tool_call_id(d.tool_call_id_type, None, plan.history_tool_call_cnt + i)
