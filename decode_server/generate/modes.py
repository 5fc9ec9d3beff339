"""One record per output mode: the only place that tells the modes apart.

`protocol.generate.MODE_TYPES` holds each mode's wire types; its record here adds what the mode
needs of the server, its logprob form, its final stage and its fields on the wire. Admission
(rules, sampling, the plan), the stage stack and the wire ask the record, never the mode's name:
a new mode is a record here, its stage and its wire types.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from vllm.sampling_params import SamplingParams

from decode_server.generate.pipeline.derender import derender_batch, stream_derender
from decode_server.generate.pipeline.logprobs import LogprobForm, StepStage, chat_form, integer_form, text_form
from decode_server.generate.pipeline.steps import ChoiceStep, Step
from protocol.generate import MODE_TYPES, ModeTypes

# A batch request's final stage: (steps, the plan admission made) → steps
BatchStage = Callable[[AsyncIterator[Step], Any], AsyncIterator[Step]]
# A stream's final stage: (the plan, prompt token ids, sampling params) → its per-step stage
StreamStage = Callable[[Any, list[int], SamplingParams], StepStage]


@dataclass(frozen=True, slots=True)
class Mode:
    name: str  # `output_mode` on the wire
    needs_tokenizer: bool  # refused on a server without one (--tokens-only)
    # The engine's detokenized text is on the wire: `detokenize` may not be false, and a step
    # that brings only text (held back for stop strings, then flushed) is kept.
    needs_text: bool
    # Reads the chat context (`parse_context` / `chat_request`): admission plans the final stage from it.
    reads_chat_context: bool
    logprobs: LogprobForm
    # The last stage before the stats and the wire, for a batch request and for a stream; None: none.
    batch_stage: BatchStage | None
    stream_stage: StreamStage | None
    types: ModeTypes
    fields: Callable[[ChoiceStep, bool], dict[str, Any]]  # (choice, batch) → the mode's choice fields


def _no_fields(c: ChoiceStep, batch: bool) -> dict[str, Any]:
    return {}


def _text(c: ChoiceStep, batch: bool) -> dict[str, Any]:
    return {"text": c.text}


def _message(c: ChoiceStep, batch: bool) -> dict[str, Any]:
    return {"message": c.message} if batch else {"delta": c.delta}


TOKENS = Mode(
    "tokens", needs_tokenizer=False, needs_text=False, reads_chat_context=False,
    logprobs=integer_form, batch_stage=None, stream_stage=None, types=MODE_TYPES["tokens"], fields=_no_fields,
)
TEXT = Mode(
    "text", needs_tokenizer=True, needs_text=True, reads_chat_context=False,
    logprobs=text_form, batch_stage=None, stream_stage=None, types=MODE_TYPES["text"], fields=_text,
)
# Answers as coupled /v1/chat/completions would: chat's logprob cut, vLLM's parsers.
DERENDER = Mode(
    "derender", needs_tokenizer=True, needs_text=True, reads_chat_context=True,
    logprobs=chat_form, batch_stage=derender_batch, stream_stage=stream_derender, types=MODE_TYPES["derender"], fields=_message,
)

MODES: dict[str, Mode] = {mode.name: mode for mode in (TOKENS, TEXT, DERENDER)}
assert MODES.keys() == MODE_TYPES.keys(), "every output mode on the wire has a record here"
