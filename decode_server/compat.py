"""The one place where the vLLM versions this server runs on (0.32, 0.33) differ.

Each difference is a named behaviour, chosen once from the imported vLLM; the rest of the code
asks for the behaviour, never for the version, and where vLLM has the code for it the behaviour
is vLLM's own. A client of a 0.33 pool gets 0.33's answers, a client of a 0.32 pool 0.32's;
docs/vllm-differences.md lists them per version. Supporting a next vLLM is a column here.

Follow the running vLLM without a behaviour here (we call vLLM's code): a paused engine's 503
"Generation is paused…" and stream error events (`errors.describe` → `create_error_response`),
and `set_prompt_token_ids` reaching the reasoning parser (vLLM's DelegatingParser).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

import vllm

VLLM_VERSION = vllm.__version__
# The release line ("0.32", "0.33"): a dev or patch build of a line behaves as the line.
VLLM_LINE = ".".join(VLLM_VERSION.split(".")[:2])
SUPPORTED_LINES = ("0.32", "0.33")
if VLLM_LINE not in SUPPORTED_LINES:
    raise ImportError(
        f"decode-server runs on vLLM {' or '.join(SUPPORTED_LINES)}; this is vLLM {VLLM_VERSION} "
        "(docs/vllm-versions.md, 'Upgrading': how a next version is checked)"
    )
_V033 = VLLM_LINE == "0.33"


def cli_args() -> ModuleType:
    """vLLM's `serve` argument parser module (make_arg_parser, validate_parsed_serve_args):
    0.33 moved it from entrypoints/launchers to entrypoints/common."""
    return importlib.import_module("vllm.entrypoints.common.cli_args" if _V033 else "vllm.entrypoints.launchers.cli_args")


# ------------------------------------------------------------------ tokens/text top_logprobs


def _cut_to_max_k_1(num_top: int, available: int) -> int:
    # 0.32's generate: max(k, 1) entries (the sampled token first), all for -1.
    return available if num_top == -1 else min(available, max(num_top, 1))


def _every_candidate(num_top: int, available: int) -> int:
    # 0.33's generate: every candidate the engine returned (k, or k+1 when the sampled token is outside the top k).
    return available


# (the request's logprobs, the entries the engine returned) → how many the tokens/text levels show
TOP_LOGPROBS_CUT: Callable[[int, int], int] = _every_candidate if _V033 else _cut_to_max_k_1


# ------------------------------------------------------------------ parse_context


async def _vllm_parse_context_error(body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """0.33: `parse_context` is a field of vLLM's GenerateRequest, validated at every level (its
    unknown keys only at derender): vLLM's model validates it, vLLM's handler writes the 400."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
    from vllm.entrypoints.serve.exception_handling.handlers.validation import validation_exception_handler

    # Only the fields its validators read: whatever else is wrong was refused before.
    probe = {"token_ids": [0], "sampling_params": {}, "output_mode": body["output_mode"], "parse_context": body["parse_context"]}
    try:
        GenerateRequest.model_validate(probe)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]  # as FastAPI reports a body
        request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(args=SimpleNamespace(log_error_stack=False))))
        response = await validation_exception_handler(request, RequestValidationError(errors))  # type: ignore[arg-type]
        import json

        return response.status_code, json.loads(response.body)["error"]
    return None


async def _parse_context_read_at_derender_only(body: dict[str, Any]) -> None:
    return None  # 0.32 has no parse_context field: ours reads it at derender only


# ({"output_mode", "parse_context"}) → None, or (status, vLLM's error info) when the pool's vLLM refuses it
PARSE_CONTEXT_ERROR: Callable[[dict[str, Any]], Any] = (
    _vllm_parse_context_error if _V033 else _parse_context_read_at_derender_only
)


# ------------------------------------------------------------------ tool calls in the history


def _count_with_setter(parser: Any, count: int) -> None:
    parser.set_history_tool_call_count(count)  # 0.33: ParseContext's history_tool_call_cnt reaches the parser


def _count_into_stream_state(parser: Any, count: int) -> None:
    # 0.32 counts the history from request.messages only (empty on a decode server): set its state.
    parser._stream_state.history_tool_call_cnt = count
    parser._stream_state.history_tool_call_cnt_initialized = True


# (a new derender parser, the tool calls the rendered history holds) → the parser numbers its ids after them
SET_HISTORY_TOOL_CALL_COUNT: Callable[[Any, int], None] = _count_with_setter if _V033 else _count_into_stream_state


# ------------------------------------------------------------------ batch derender


def vllm_batch_derenderer(model_config: Any, renderer: Any, config: Any) -> Any | None:
    """0.33 serves batch derender itself: its OnlineDerenderer builds each message (role
    "assistant", `assemble_chat_message_fields`, `resolve_finish_reason`, the parse_context's
    chat_template_kwargs as sent) from a parse_context it validated (`ParseContext.to_chat_request`).
    None on 0.32, which has no derender level: ours assembles as coupled chat does."""
    if not _V033 or renderer is None:
        return None
    from vllm.renderers.online_derenderer import OnlineDerenderer

    return OnlineDerenderer(
        model_config,
        renderer,
        request_logger=None,
        chat_template=config.chat_template,
        chat_template_content_format="auto",
        enable_auto_tools=config.enable_auto_tool_choice,
        tool_parser=config.tool_call_parser,
        reasoning_parser=config.reasoning_parser,
        default_chat_template_kwargs=config.default_chat_template_kwargs or None,
    )


# 0.33's message for a derender request without parse_context on a server with parsers (ServingTokens).
VLLM_DERENDER_WITHOUT_CONTEXT = (
    "output_mode='derender' requires parse_context on a server with a tool or reasoning parser. "
    "Use the one returned by /render."
)


# ------------------------------------------------------------------ one pass per engine step


class _PutSignal:
    """Stands in for a RequestOutputCollector's `ready` event: its `put` sets `ready`, and that set
    is the only signal a put gives. Nothing awaits this one: the consumer reads the collector with
    `get_nowait` (generate/one_pass.py), so a put calls `on_put` instead of waking a task."""

    __slots__ = ("_on_put",)

    def __init__(self, on_put: Callable[[], None]):
        self._on_put = on_put

    def set(self) -> None:
        self._on_put()

    def clear(self) -> None:
        pass

    def is_set(self) -> bool:
        return False

    async def wait(self) -> None:
        raise RuntimeError("a collector read by the one-pass consumer is read with get_nowait, never awaited")


def _generate_errors() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(what vLLM's `generate()` raises as it is, not wrapped in EngineGenerateError; which of those
    it raises without aborting the request). 0.33 adds GenerationError to the first (a paused
    engine's refusal is one) and aborts all but a dead engine's; 0.32 aborts none of them."""
    from vllm.exceptions import GenerationError, GracefulHTTPError, VLLMClientError
    from vllm.v1.engine.exceptions import EngineDeadError

    if _V033:
        return (EngineDeadError, VLLMClientError, GracefulHTTPError, GenerationError), (EngineDeadError,)
    as_is = (EngineDeadError, VLLMClientError, GracefulHTTPError)
    return as_is, as_is


GENERATE_RAISES_AS_IS, GENERATE_DOES_NOT_ABORT = _generate_errors()


def _collector_signals_puts() -> bool:
    """Whether vLLM's RequestOutputCollector keeps `output` and signals a put through `ready` (0.32
    and 0.33 both do); a vLLM that does not gets the fallback, its own `generate()`."""
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.output_processor import RequestOutputCollector

    probe = RequestOutputCollector(RequestOutputKind.DELTA, "probe")
    return hasattr(probe, "ready") and hasattr(probe, "output") and hasattr(probe, "get_nowait")


def step_collectors(llm: Any) -> bool:
    """Whether this engine client's requests can be read by the one-pass consumer: vLLM's AsyncLLM,
    whose `add_request` returns the request's RequestOutputCollector (`generate()` is a loop over it)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return isinstance(llm, AsyncLLM) and _COLLECTOR_SIGNALS_PUTS


def on_put(collector: Any, callback: Callable[[], None]) -> None:
    """`callback()` on every put into `collector` (one that came before this is reported now)."""
    collector.ready = _PutSignal(callback)
    if collector.output is not None:
        callback()


_COLLECTOR_SIGNALS_PUTS = _collector_signals_puts()
