"""How each family's model writes reasoning and tool calls, from its chat template and its parsers'
regexes and markers: the text a family row's scripts are tokenized from (tests/support/parser_matrix/families.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.support.family_tokenizers import HY, MINIMAX_M3_NS
from tests.support import chat_cases as cc


def _xml_params(args: dict[str, Any], open_: str, close: str) -> str:
    return "".join(f"{open_.format(k=k)}{v if isinstance(v, str) else json.dumps(v)}{close}" for k, v in args.items())


def _same(text: str) -> str:
    return text


@dataclass(frozen=True)
class Format:
    think: Callable[[str], str]  # reasoning as the model writes it (the prompt did not open it)
    calls: Callable[[list[tuple[str, dict[str, Any]]]], str]  # one or more calls, as one block
    content: Callable[[str], str] = _same  # the answer, where it is not plain text
    preamble: Callable[[str], str] = lambda text: text + " "  # content written before calls
    after_calls: Callable[[str], str] = lambda text: " " + text  # content after calls ("" if a call ends the turn)
    calls_per_turn: int = 2
    cut_at: int = 9  # max_tokens of call_cut_by_length: the output ends inside the call's arguments
    opening: str = ""  # what an output without a thought of its own starts with (the family always frames one)
    forced_prefix: str = ""  # before the calls where vLLM forces markup for required/named (its structural tag)


def _think(text: str) -> str:
    return f"<think>\n{text}\n</think>\n\n"


def _opened_think(text: str) -> str:
    # The template opened the thought at the end of the prompt: the model writes it and its end.
    return f"{text}\n</think>\n\n"


def _steptml(n: str, a: dict[str, Any], i: int) -> str:
    params = _xml_params(a, '<steptml:parameter name="{k}">', "</steptml:parameter>")
    return f'<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="{n}">{params}</steptml:invoke><｜tool_call_end｜>'


def _each(one: Callable[[str, dict[str, Any], int], str], sep: str = "", head: str = "", tail: str = "") -> Callable:
    return lambda calls: head + sep.join(one(n, a, i) for i, (n, a) in enumerate(calls)) + tail


def _json(args: dict[str, Any]) -> str:
    return json.dumps(args, ensure_ascii=False)


def _cohere_action(calls: list[tuple[str, dict[str, Any]]]) -> str:
    # One action block holds every call of the turn, a JSON list as cohere_melody's templates write it.
    listed = ",\n".join(
        "    " + json.dumps({"tool_call_id": str(i), "tool_name": n, "parameters": a}, ensure_ascii=False)
        for i, (n, a) in enumerate(calls)
    )
    return f"<|START_ACTION|>[\n{listed}\n]<|END_ACTION|>"


def _cohere(answer_open: str, answer_close: str) -> Format:
    # The turn ends after the action block (the model writes <|END_OF_TURN_TOKEN|>, its EOS, next);
    # content before the calls is an answer block, which the family's parser reads as content.
    answer = lambda text: f"{answer_open}{text}{answer_close}"  # noqa: E731
    return Format(
        lambda text: f"<|START_THINKING|>{text}<|END_THINKING|>",
        _cohere_action,
        content=answer,
        preamble=answer,
        after_calls=lambda text: "",
        cut_at=36,  # the action's JSON spends 9 tokens before the first call's name
    )


def _hunyuan(sep: str, between: str) -> Format:
    # Hy3 writes <tool_sep> after the name and a newline after each tag; Hy4 neither (vLLM's
    # hy_v3/hy_v4 parsers and their tests of the two checkpoints' token shapes).
    tag = lambda name: f"<{name}{HY}>"  # noqa: E731
    return Format(
        # The template opens <think> at the end of the prompt (or closes it there, no_think): the
        # model writes the reasoning and its end.
        lambda text: f"{text}{tag('/think')}",
        _each(
            lambda n, a, i: f"{tag('tool_call')}{n}{sep}"
            + _xml_params(a, tag("arg_key") + "{k}" + tag("/arg_key") + between + tag("arg_value"), tag("/arg_value") + between)
            + tag("/tool_call"),
            between,
            tag("tool_calls") + "\n",
            "\n" + tag("/tool_calls"),
        ),
    )


def _pythonic(args: dict[str, Any]) -> str:
    # A JSON string or number is a Python literal too (escapes included).
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())


def _pythonic_list(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "[" + ", ".join(f"{n}({_pythonic(a)})" for n, a in calls) + "]"


def _json_list(marker: str) -> Callable:
    # The turn's calls as one JSON list after a marker, no closing marker (Granite 3.x, Phi-4-mini).
    return lambda calls: marker + json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)


def _granite_thought(text: str) -> str:
    # Granite 3.2's thinking mode: plain-text markers around the thought, then the answer.
    return f"Here is my thought process:\n{text}\nHere is my response:\n"


def _dsml(calls_tag: str, sep: str = "") -> Callable:
    # DeepSeek's DSML (V3.2, V4; V4.1 with a space after the marker): strings raw, other values JSON.
    mark = f"｜DSML｜{sep}"
    param = lambda k, v: (  # noqa: E731
        f'<{mark}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
        f"{v if isinstance(v, str) else json.dumps(v)}</{mark}parameter>\n"
    )
    return _each(
        lambda n, a, i: f'<{mark}invoke name="{n}">\n' + "".join(param(k, v) for k, v in a.items()) + f"</{mark}invoke>\n",
        "",
        f"<{mark}{calls_tag}>\n",
        f"</{mark}{calls_tag}>",
    )


def _minimax_m3(n: str, a: dict[str, Any], i: int) -> str:
    ns = MINIMAX_M3_NS
    return f'{ns}<invoke name="{n}">' + "".join(f"{ns}<{k}>{v if isinstance(v, str) else json.dumps(v)}{ns}</{k}>" for k, v in a.items()) + f"{ns}</invoke>"


FORMATS: dict[str, Format] = {
    "hermes": Format(_think, _each(lambda n, a, i: cc.call(n, a), "\n")),
    "qwen3_coder": Format(
        _think,
        _each(
            lambda n, a, i: f"<tool_call>\n<function={n}>\n"
            + _xml_params(a, "<parameter={k}>\n", "\n</parameter>\n")
            + "</function>\n</tool_call>",
            "\n",
        ),
    ),
    "deepseek_v3": Format(
        _think,
        _each(
            lambda n, a, i: f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{_json(a)}\n```<｜tool▁call▁end｜>",
            "\n",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
        ),
    ),
    "deepseek_v31": Format(
        _think,
        _each(
            lambda n, a, i: f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{_json(a)}<｜tool▁call▁end｜>",
            "",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
        ),
    ),
    "kimi_k2": Format(
        _think,
        _each(
            lambda n, a, i: f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{_json(a)}<|tool_call_end|>",
            "",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
        ),
    ),
    "glm45": Format(
        _think,
        _each(
            lambda n, a, i: f"<tool_call>{n}\n"
            + _xml_params(a, "<arg_key>{k}</arg_key>\n<arg_value>", "</arg_value>\n")
            + "</tool_call>",
            "\n",
        ),
    ),
    "glm47": Format(
        _think,
        _each(lambda n, a, i: f"<tool_call>{n}" + _xml_params(a, "<arg_key>{k}</arg_key><arg_value>", "</arg_value>") + "</tool_call>"),
    ),
    "llama3_json": Format(_think, _each(lambda n, a, i: json.dumps({"name": n, "parameters": a}, ensure_ascii=False), "; ", "<|python_tag|>")),
    "seed_oss": Format(
        lambda text: f"<seed:think>{text}</seed:think>",
        _each(
            lambda n, a, i: f"<seed:tool_call>\n<function={n}>\n"
            + _xml_params(a, "<parameter={k}>", "</parameter>\n")
            + "</function>\n</seed:tool_call>",
            "",
        ),
    ),
    "mistral": Format(
        lambda text: f"[THINK]{text}[/THINK]",
        _each(lambda n, a, i: f"[TOOL_CALLS]{n}[ARGS]{_json(a)}"),
    ),
    # Mistral's pre-v11 tokenizers (NeMo's Tekken v3): the turn's calls as one JSON list after [TOOL_CALLS], ending it.
    "mistral_v3": Format(_think, _json_list("[TOOL_CALLS]"), after_calls=lambda text: ""),
    # gpt-oss (harmony): every message in a channel; a call ends the turn (<|call|> is a stop token).
    "harmony": Format(
        lambda text: f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant",
        _each(lambda n, a, i: f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{_json(a)}<|call|>"),
        content=lambda text: f"<|channel|>final<|message|>{text}",
        preamble=lambda text: f"<|channel|>commentary<|message|>{text}<|end|><|start|>assistant",
        after_calls=lambda text: "",
        calls_per_turn=1,
    ),
    # cmd3 (Command A, R7B) answers in a response block, cmd4 (Command A Reasoning) in a text block.
    "cohere_command3": _cohere("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
    "cohere_command4": _cohere("<|START_TEXT|>", "<|END_TEXT|>"),
    "minimax_m2": Format(
        _think,
        _each(
            lambda n, a, i: f'<invoke name="{n}">\n' + _xml_params(a, '<parameter name="{k}">', "</parameter>\n") + "</invoke>\n",
            "",
            "<minimax:tool_call>\n",
            "</minimax:tool_call>",
        ),
    ),
    "hy_v3": _hunyuan(f"<tool_sep{HY}>\n", "\n"),
    "hy_v4": _hunyuan("", ""),
    # Jamba: one JSON list of every call of the turn, as vLLM's jamba tests write it.
    "jamba": Format(
        _think,
        lambda calls: "<tool_calls>[\n"
        + ",\n".join("    " + json.dumps({"name": n, "arguments": a}, ensure_ascii=False) for n, a in calls)
        + "\n]</tool_calls>",
    ),
    # LFM2: a Python list of calls between the sentinels, text after it.
    "lfm2": Format(_think, lambda calls: "<|tool_call_start|>[" + ", ".join(f"{n}({_pythonic(a)})" for n, a in calls) + "]<|tool_call_end|>"),
    # K2 Horizon at its default reasoning effort (high) and tool_call_format (xml).
    "k2_horizon": Format(
        lambda text: f"<ifm|think>{text}</ifm|think>",
        _each(
            lambda n, a, i: f"<ifm|tool_call>{n}" + _xml_params(a, "<ifm|arg_key>{k}</ifm|arg_key><ifm|arg_value>", "</ifm|arg_value>") + "</ifm|tool_call>",
            "\n",
            "<ifm|tool_calls>",
            "</ifm|tool_calls>",
        ),
    ),
    # Granite 3.x: one JSON list of the turn's calls after <|tool_call|>, no closing marker.
    "granite": Format(_granite_thought, _json_list("<|tool_call|>"), after_calls=lambda text: ""),
    # granite-20b-functioncalling: each call a JSON object after its own <function_call>.
    "granite_20b_fc": Format(
        _granite_thought,
        _each(lambda n, a, i: f"<function_call> {json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}", "\n"),
        after_calls=lambda text: "",
    ),
    # Pythonic (Llama 3.2, ToolACE): the whole output is a Python list of calls.
    "pythonic": Format(_think, _pythonic_list, after_calls=lambda text: ""),
    # Llama 4: the same list between <|python_start|> and <|python_end|>.
    "llama4_pythonic": Format(_think, lambda calls: "<|python_start|>" + _pythonic_list(calls) + "<|python_end|>", after_calls=lambda text: ""),
    # OLMo 3: one call a line between <function_calls> tags, JSON literals for values.
    "olmo3": Format(
        _think,
        lambda calls: "<function_calls>" + "\n".join(f"{n}({_pythonic(a)})" for n, a in calls) + "</function_calls>",
        after_calls=lambda text: "",
    ),
    # DeepSeek V3.2 has no think block of its own (V3's deepseek_v3 reasoning parser runs beside it).
    "deepseek_v32": Format(_think, _dsml("function_calls")),
    "deepseek_v4": Format(_think, _dsml("tool_calls")),
    "deepseek_v41": Format(_think, _dsml("calls", " ")),
    # Phi-4-mini: one JSON list of the turn's calls after `functools`.
    "phi4_mini_json": Format(_think, _json_list("functools"), after_calls=lambda text: ""),
    # InternLM2: one call per turn, a JSON object in the plugin action.
    "internlm": Format(
        _think,
        _each(lambda n, a, i: "<|action_start|><|plugin|>\n" + json.dumps({"name": n, "parameters": a}, ensure_ascii=False) + "<|action_end|>"),
        after_calls=lambda text: "",
        calls_per_turn=1,
    ),
    # LongCat-Flash: hermes' calls in LongCat's tags.
    "longcat": Format(_think, _each(lambda n, a, i: cc.call(n, a).replace("tool_call>", "longcat_tool_call>"), "\n")),
    # ERNIE 4.5 thinking: the template opens the thought; the model ends it with `\n</think>\n\n`, then
    # answers in a <response> block or writes its calls, each in a <tool_call> block.
    "ernie45": Format(
        _opened_think,
        _each(lambda n, a, i: cc.call(n, a) + "\n"),
        content=lambda text: f"<response>\n{text}\n</response>\n",
        preamble=lambda text: text + "\n",
        after_calls=lambda text: "",
    ),
    # dots.llm1: every call an <invoke> in one block, values as written (vLLM converts them by the tool's schema).
    "dots": Format(
        _think,
        _each(
            lambda n, a, i: f'<invoke name="{n}">\n' + _xml_params(a, '<parameter name="{k}">', "</parameter>\n") + "</invoke>\n",
            "",
            "<dots_function_call>\n",
            "</dots_function_call>",
        ),
    ),
    # Apertus: a JSON list of {name: arguments} objects between its special tokens.
    "apertus": Format(_think, lambda calls: "<|tools_prefix|>" + _json([{n: a} for n, a in calls]) + "<|tools_suffix|>"),
    # xLAM: the turn's calls as a bare JSON list, after any thought.
    "xlam": Format(_think, _json_list(""), after_calls=lambda text: ""),
    # Step-3: one block of calls, each `function` and a StepTML invoke (values as written: vLLM casts by schema).
    "step3": Format(_opened_think, _each(_steptml, "", "<｜tool_calls_begin｜>", "<｜tool_calls_end｜>")),
    # GigaChat 3: one call per turn, the function-call role's JSON to the end of the output.
    "gigachat3": Format(
        _think,
        _each(lambda n, a, i: "<|message_sep|>function call<|role_sep|>\n" + _json({"name": n, "arguments": a})),
        after_calls=lambda text: "",
        calls_per_turn=1,
    ),
    # MiniMax M3: the block ends the message (vLLM's parser drops text after it).
    "minimax_m3": Format(
        lambda text: f"<mm:think>{text}</mm:think>",
        _each(_minimax_m3, "\n", f"{MINIMAX_M3_NS}<tool_call>\n", f"\n{MINIMAX_M3_NS}</tool_call>"),
        after_calls=lambda text: "",
    ),
}

# The formats of further families (tests/support/parser_matrix/formats_b.py), read from their parsers.
from tests.support.parser_matrix.formats_b import FORMATS_B  # noqa: E402 (needs FORMATS and Format above)

FORMATS.update(FORMATS_B)

from tests.support.parser_matrix.formats_c import FORMATS_C  # noqa: E402 (it builds on Format above)
from tests.support.parser_matrix.formats_a import FORMATS_A  # noqa: E402 (Gemma 4, FunctionGemma, MiMo, MiniCPM5, MiniMax M2)

FORMATS.update(FORMATS_C)
FORMATS.update(FORMATS_A)
