"""How the families of inkling, ling3, muse_glimmer, plamo3, step3p5 and hunyuan_a13b write reasoning
and tool calls, read from vLLM's parsers (vllm/parser/inkling.py, ling3.py, plamo3.py, step3p5.py,
vllm/tool_parsers/muse_glimmer_tool_parser.py, hunyuan_a13b_tool_parser.py,
vllm/reasoning/hunyuan_a13b_reasoning_parser.py) and merged into formats.FORMATS.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.parser_matrix.formats import FORMATS, Format, _each, _json

# Inkling: every block is `<|message_model|>`, its content kind, its body and `<|end_message|>`.
# The prompt ends with `<|message_model|>` (vLLM's parser starts in the message header), so the
# model's first block opens with its kind; each later block opens with the role marker.
INKLING_NEXT = "<|message_model|>"


def _inkling_call(n: str, a: dict[str, Any], i: int) -> str:
    # The tool block's payload is one JSON object, arguments under `args` (vLLM carves them out).
    return "<|content_invoke_tool_json|>" + _json({"name": n, "args": a}) + "<|end_message|>"


# PLaMo 3's markers are `<|plamo:begin_` / `<|plamo:end_` + a name + `:plamo|>` (three tokens each).
def _plamo(mark: str) -> str:
    return f"<|plamo:{mark}:plamo|>"


def _plamo_call(n: str, a: dict[str, Any], i: int) -> str:
    return (
        _plamo("begin_tool_request")
        + _plamo("begin_tool_name") + n + _plamo("end_tool_name")
        + _plamo("begin_tool_arguments") + "<|plamo:constrain|>json<|plamo:msg|>" + _json(a) + _plamo("end_tool_arguments")
        + _plamo("end_tool_request")
    )


# MuseGlimmer: channel-scoped messages `to=<recipient><|message|>body` ended by `<|eom|>` (more
# follows) or `<|eot|>` (the turn's end). The prompt ends with `<|start|>assistant`, so the turn's
# first message starts at ` to=`; every later one with `<|start|>assistant`.
MUSE_NEXT = "<|start|>assistant"


def _muse_call(n: str, a: dict[str, Any], i: int) -> str:
    # One tool-channel message per call, the invoke in an ATEM block; values as written (vLLM's
    # parser JSON-decodes a value where it can, else keeps the string).
    params = "".join(f'<atem:parameter name="{k}">{v if isinstance(v, str) else json.dumps(v)}</atem:parameter>\n' for k, v in a.items())
    return f' to={n}<|message|><atem:function_calls>\n<atem:invoke name="{n}">\n{params}</atem:invoke>\n</atem:function_calls><|eom|>'


# Hunyuan A13B: every output is a think block and an answer block; without a thought the block is
# empty (its fast-think form, `<think>\n\n</think>\n`: vLLM's parser knows both by their token ids).
A13B_FAST_THINK = "<think>\n\n</think>\n<answer>\n"


def _a13b_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    # The turn's calls as one JSON list in <tool_calls>, in the answer block, which they end.
    return "<tool_calls>" + json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False) + "</tool_calls>\n</answer>"


def _xtml(tag: str, text: str) -> str:
    # Kimi K3's XTML: <|open|>, <|sep|> and <|close|> are special tokens around each channel.
    return f"<|open|>{tag}<|sep|>{text}<|close|>{tag.split()[0]}<|sep|>"


def _kimi_k3_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    def argument(k: str, v: Any) -> str:
        return _xtml(f'argument key="{k}" type="{"string" if isinstance(v, str) else "number"}"', v if isinstance(v, str) else json.dumps(v))

    return _xtml("tools", "".join(_xtml(f'call tool="{n}" index="{i + 1}"', "".join(argument(k, v) for k, v in a.items())) for i, (n, a) in enumerate(calls)))


FORMATS_B: dict[str, Format] = {
    # Kimi K3: reasoning, the reply and the calls each in their XTML channel; the reply precedes the calls.
    "kimi_k3": Format(
        lambda text: _xtml("think", text),
        _kimi_k3_calls,
        content=lambda text: _xtml("response", text),
        preamble=lambda text: _xtml("response", text),
        after_calls=lambda text: "",
        forced_prefix=_xtml("response", ""),  # K3's structural tag: a reply channel, then the calls
    ),
    # Inkling: a thinking block, then text blocks and tool blocks in any order (text may follow calls).
    "inkling": Format(
        lambda text: f"<|content_thinking|>{text}<|end_message|>{INKLING_NEXT}",
        _each(_inkling_call, INKLING_NEXT),
        content=lambda text: f"<|content_text|>{text}<|end_message|>",
        preamble=lambda text: f"<|content_text|>{text}<|end_message|>{INKLING_NEXT}",
        after_calls=lambda text: f"{INKLING_NEXT}<|content_text|>{text}<|end_message|>",
        # Inside the JSON of `args`. Not 16: SamplingParams' default, which vLLM's render leaves out of the
        # generate request (msgspec omit_defaults), and a generate server then fills from the model.
        cut_at=17,
    ),
    # PLaMo 3: vLLM's parser starts in reasoning (thinking on) and absorbs an opening marker; the model
    # writes the block, then its requests in one begin/end_tool_requests block.
    "plamo3": Format(
        lambda text: _plamo("begin_think") + text + _plamo("end_think"),
        _each(_plamo_call, "", _plamo("begin_tool_requests"), _plamo("end_tool_requests")),
        cut_at=30,  # past `<|plamo:msg|>`, inside the arguments' JSON
    ),
    "muse_glimmer": Format(
        lambda text: f" to=self<|message|>{text}<|eom|>{MUSE_NEXT}",
        _each(_muse_call, MUSE_NEXT),
        content=lambda text: f" to=user<|message|>{text}<|eot|>",
        preamble=lambda text: f" to=user<|message|>{text}<|eom|>{MUSE_NEXT}",
        after_calls=lambda text: "",  # a call's message ends the turn: the tool's answer comes next
        cut_at=32,  # inside the first parameter's value
    ),
    # Step-3.5 / 3.7: the template always opens `<think>\n`; the model ends it with `\n</think>\n` and
    # writes Qwen3-Coder's XML calls.
    "step3p5": Format(lambda text: f"{text}\n</think>\n", FORMATS["qwen3_coder"].calls),
    "hunyuan_a13b": Format(
        lambda text: f"<think>\n{text}\n</think>\n<answer>\n",
        _a13b_calls,
        content=lambda text: f"{text}\n</answer>",
        preamble=lambda text: text + "\n",
        after_calls=lambda text: "",
        opening=A13B_FAST_THINK,
        cut_at=30,  # inside the arguments' JSON
    ),
}
