"""Per family: how its model writes reasoning and tool calls (from its chat template and parser),
and the chat cases every family row runs.

A row is (family tokenizer, tool parser, reasoning parser, format, any further serve flags). The
format writes the text a model of that family would emit; the scripts are that text tokenized with
the family's tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests import chat_cases as cc

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
}
TOOLS = [cc.WEATHER, SEARCH]
# Unicode, quotes, a backslash and a newline: what escaping bugs show on.
WEATHER_ARGS = {"city": 'Zürich "Altstadt" 東京'}
SEARCH_ARGS = {"query": "a\\b\nc ✓", "limit": 3}


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


def _think(text: str) -> str:
    return f"<think>\n{text}\n</think>\n\n"


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
}


@dataclass(frozen=True)
class Row:
    family: str  # decode_server/tools/family_tokenizers.py FAMILIES key
    tool_parser: str | None
    reasoning_parser: str | None
    format: str  # FORMATS key
    # False where the reasoning parser has no off switch (deepseek_r1: the prompt always opens
    # <think>, so vLLM reads everything before </think> as reasoning, whatever chat_template_kwargs say).
    thinking_switch: bool = True
    # (case, what vLLM's render answers): cases the render server refuses with a 400, so no
    # decode server sees them; the refusal is asserted instead of the parity.
    refused_at_render: tuple[tuple[str, str], ...] = ()
    serve_flags: tuple[str, ...] = ()  # further flags both servers get (how the family is served)

    @property
    def id(self) -> str:
        return f"{self.family}:{self.tool_parser or '-'}+{self.reasoning_parser or '-'}"

    @property
    def flags(self) -> list[str]:
        return flags(self.tool_parser, self.reasoning_parser) + list(self.serve_flags)


def flags(tool_parser: str | None, reasoning_parser: str | None) -> list[str]:
    """The serve flags that select these parsers (either may be None)."""
    out = ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser] if tool_parser else []
    return out + (["--reasoning-parser", reasoning_parser] if reasoning_parser else [])


ROWS = [
    Row("qwen3", "hermes", "qwen3", "hermes"),
    Row("qwen3", "qwen3_coder", "qwen3", "qwen3_coder"),
    Row("qwen3", "qwen3_xml", "qwen3", "qwen3_coder"),
    Row("deepseek_v3", "deepseek_v3", "deepseek_r1", "deepseek_v3", thinking_switch=False),
    Row("deepseek_v3", "deepseek_v31", "deepseek_v3", "deepseek_v31"),
    Row("kimi_k2", "kimi_k2", "kimi_k2", "kimi_k2"),
    Row("glm45", "glm45", "glm45", "glm45"),
    Row("glm45", "glm47", "glm47", "glm47"),
    Row("seed_oss", "seed_oss", "seed_oss", "seed_oss"),
    Row("minimax_m2", "minimax_m2", "minimax_m2", "minimax_m2"),
    Row("llama3", "llama3_json", None, "llama3_json"),
    Row("llama3", "llama4_json", None, "llama3_json"),
    Row("mistral", "mistral", "mistral", "mistral"),
    # As vLLM serves Command models: cohere_melody renders the prompt (cmd4's unless told cmd3).
    Row(
        "cohere",
        "cohere_command3",
        "cohere_command3",
        "cohere_command3",
        serve_flags=("--tokenizer-mode", "cohere", "--default-chat-template-kwargs", '{"cohere_format": "cmd3"}'),
    ),
    Row("cohere", "cohere_command4", "cohere_command4", "cohere_command4", serve_flags=("--tokenizer-mode", "cohere")),
    Row(
        "qwen3_hf",
        "hf",
        "hf",
        "hermes",
        refused_at_render=tuple(
            (f"tool_choice_{kind}", f"response_template parsing cannot guarantee {kind} tool choice")
            for kind in ("required", "named")
        ),
    ),
    # vLLM picks HarmonyParser for a gpt_oss model whatever the flags; these are the flags it documents.
    Row("gpt_oss", "openai", "openai_gptoss", "harmony", thinking_switch=False),
]

# Rows that do not pass yet, with what was observed (docs/parsers.md, "Open"). Counted as covered
# by the registry check only because the reason is written here; they are not run.
OPEN: dict[Row, str] = {}


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    chat: dict[str, Any] = field(default_factory=dict)
    calls: tuple[str, ...] = ()  # the tool calls vLLM's batch answer must hold: the script is in the family's format
    # Why our stream deliberately differs from vLLM's (a link into docs/vllm-differences.md);
    # then the batch answers match and our folded stream equals our batch answer.
    differs: str | None = None


MULTI_TOKEN_CASES = ("reasoning_then_content", "reasoning_then_two_calls", "call_cut_by_length")
STOP_STRINGS = "vllm-differences.md#derender-stop-string-alignment"


def cases(row: Row) -> list[Case]:
    f = FORMATS[row.format]
    several = [("get_weather", WEATHER_ARGS), ("search", SEARCH_ARGS)][: f.calls_per_turn]
    both = f.calls(several)
    one = f.calls([("get_weather", WEATHER_ARGS)])
    think = f.think("The user wants the weather; I will call the tools.") if row.reasoning_parser else ""
    out = [Case("reasoning_then_content", (think or "") + f.content("It is sunny in Zürich."))]
    if row.tool_parser:
        tools = {"tools": TOOLS}
        out += [
            Case("reasoning_then_two_calls", think + both, tools, tuple(n for n, _ in several)),
            Case("content_around_calls", f.preamble("Let me check.") + one + f.after_calls("Done."), tools),
            Case("call_cut_by_length", one, {**tools, "max_tokens": f.cut_at}),
            Case("stop_string_inside_markup", think + one, {**tools, "stop": ["Altstadt"]}, differs=STOP_STRINGS),
            Case("tool_choice_required", one, {**tools, "tool_choice": "required"}),
            Case("tool_choice_named", one, {**tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
            Case("tool_choice_none", f.content("No tools needed."), {**tools, "tool_choice": "none"}),
        ]
        if row.thinking_switch:
            out.append(Case("thinking_off_then_call", one, {**tools, **cc_no_thinking()}, ("get_weather",)))
    return out


def cc_no_thinking() -> dict[str, Any]:
    return {"chat_template_kwargs": {"enable_thinking": False}}
