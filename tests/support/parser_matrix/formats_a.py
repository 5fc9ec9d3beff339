"""More family formats (merged into formats.FORMATS at its end): Gemma 4, FunctionGemma, MiMo, MiniCPM5,
and MiniMax M2 as the append-think reasoning parser reads it. Each from the family's chat template
and vLLM's parser for it (its markers, regexes and argument converter)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from tests.support.parser_matrix.formats import FORMATS, Format, _each, _opened_think, _think, _xml_params


def _gemma_args(args: dict[str, Any], quote: str) -> str:
    # Gemma's templates write keys bare, strings between the family's quote token and other values
    # as JSON literals (Gemma 4: <|"|>; FunctionGemma: <escape>), joined by commas without spaces.
    return ",".join(f"{k}:{quote}{v}{quote}" if isinstance(v, str) else f"{k}:{json.dumps(v)}" for k, v in args.items())


GEMMA4_QUOTE = '<|"|>'  # Gemma 4's string delimiter, one special token

# Why a stop string inside the call makes vLLM's minicpm5 stream lose it (families.Row.stop_string_loses_call).
MINICPM5_LOSES_CALL = (
    "vLLM's streaming minicpm5 parser sends text as content while `<function` is not whole in the text "
    "so far (it holds a partial tag back only once a whole `<function` has appeared), then looks for calls "
    "only after what it sent; with the text held back behind the token ids, the tag's first part `<f` went "
    "out as content, and the call is never found"
)


FORMATS_A: dict[str, Format] = {
    # Gemma 4: the thought in a `thought` channel, each call `call:name{args}` in its own tool_call
    # tokens; a call ends the turn (the model writes <|tool_response> next, a stop token).
    "gemma4": Format(
        lambda text: f"<|channel>thought\n{text}<channel|>",
        _each(lambda n, a, i: f"<|tool_call>call:{n}{{{_gemma_args(a, GEMMA4_QUOTE)}}}<tool_call|>"),
        after_calls=lambda text: "",
    ),
    # FunctionGemma (no reasoning): Gemma 4's call syntax with <escape> as the string quote, between
    # its function-call tokens; the turn ends at the calls (<start_function_response> is its stop).
    "functiongemma": Format(
        _think,
        _each(lambda n, a, i: f"<start_function_call>call:{n}{{{_gemma_args(a, '<escape>')}}}<end_function_call>"),
        after_calls=lambda text: "",
    ),
    # MiMo: Qwen3-Coder's XML calls, compact (no newlines around values: MiMo's template keeps the
    # value between the parameter tags exactly as written, and so does vLLM's mimo converter).
    "mimo": Format(
        _think,
        _each(lambda n, a, i: f"<tool_call>\n<function={n}>\n" + _xml_params(a, "<parameter={k}>", "</parameter>\n") + "</function>\n</tool_call>", "\n"),
    ),
    # MiniCPM5: one <function> element a call, a <param> element an argument (vLLM's minicpm5 parser
    # reads it with an XML parser and casts by the tool's schema; no value here needs escaping).
    "minicpm5": Format(
        _think,
        _each(lambda n, a, i: f'<function name="{n}">' + _xml_params(a, '<param name="{k}">', "</param>") + "</function>", "\n"),
    ),
    # MiniMax M2 as minimax_m2_append_think reads it: the template opens <think> at the end of the
    # prompt, the model writes its thought and `</think>` (the parser adds the `<think>` back).
    "minimax_m2_opened": replace(FORMATS["minimax_m2"], think=_opened_think),
}
