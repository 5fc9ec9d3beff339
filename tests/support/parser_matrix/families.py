"""The family rows, and the chat cases every family row runs (how each family's model writes
reasoning and tool calls: tests/support/parser_matrix/formats.py).

A row is (family tokenizer, tool parser, reasoning parser, format, any further serve flags). The
format writes the text a model of that family would emit; the scripts are that text tokenized with
the family's tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import vllm

from tests.support import chat_cases as cc
from tests.support.parser_matrix import mistral_mode
from tests.support.parser_matrix.formats import FORMATS
from tests.support.parser_matrix.formats_a import MINICPM5_LOSES_CALL

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


@dataclass(frozen=True)
class Row:
    family: str  # tests/support/family_tokenizers.py FAMILIES key
    tool_parser: str | None
    reasoning_parser: str | None
    format: str  # FORMATS key
    # False where the reasoning parser has no off switch (deepseek_r1: the prompt always opens
    # <think>, so vLLM reads everything before </think> as reasoning, whatever chat_template_kwargs say).
    thinking_switch: bool = True
    # The chat_template_kwargs that switch thinking off, as the family's template reads them.
    thinking_off: tuple[tuple[str, Any], ...] = (("enable_thinking", False),)
    # (case, what vLLM's render answers): cases the render server refuses with a 400, so no
    # decode server sees them; the refusal is asserted instead of the parity.
    refused_at_render: tuple[tuple[str, str], ...] = ()
    serve_flags: tuple[str, ...] = ()  # further flags both servers get (how the family is served)
    # Why vLLM's stream, misrouted by the stop string (STOP_STRINGS), streams no call at all in
    # stop_string_inside_markup and so finishes with `stop`, where ours streamed the call.
    stop_string_loses_call: str | None = None
    lines: tuple[str, ...] = ("0.32", "0.33")  # the vLLM lines that register its parsers
    variant: str = ""  # tells apart two rows of the same parsers served another way (a mode)
    # Why vLLM's parser reads no call from the JSON its own render forces for required/named (asserted).
    forced_json_unread: str | None = None
    # Why vLLM's engine never applies the grammar its render installs for required/named: the model
    # writes free (the family's markup, scripted so), and vLLM's batch reads it as it would the JSON (asserted).
    grammar_never_applied: str | None = None

    @property
    def id(self) -> str:
        parsers = f"{self.family}:{self.tool_parser or '-'}+{self.reasoning_parser or '-'}"
        return f"{parsers}/{self.variant}" if self.variant else parsers

    @property
    def flags(self) -> list[str]:
        return flags(self.tool_parser, self.reasoning_parser) + list(self.serve_flags)


def flags(tool_parser: str | None, reasoning_parser: str | None) -> list[str]:
    """The serve flags that select these parsers (either may be None)."""
    out = ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser] if tool_parser else []
    return out + (["--reasoning-parser", reasoning_parser] if reasoning_parser else [])


NO_THINK = (("reasoning_effort", "no_think"),)
# DeepSeek's templates (V3.1 on) switch thinking with `thinking`; served on by default where the
# reasoning parser reads it from the request (deepseek_v3's parser: off unless told).
THINKING_OFF = (("thinking", False),)
THINKING_ON = ("--default-chat-template-kwargs", '{"thinking": true}')
# The vLLM line this process imports (tests/vllm033 runs on 0.33's modules).
LINE = "0.33" if vllm.__version__.startswith("0.33.") else "0.32"
HF_REFUSES_FORCED_CALLS = tuple(
    (f"tool_choice_{kind}", f"response_template parsing cannot guarantee {kind} tool choice") for kind in ("required", "named")
)

ALL_ROWS = [
    Row("qwen3", "hermes", "qwen3", "hermes"),
    Row("qwen3", "qwen3_json", "qwen3", "hermes"),  # Qwen2.5/QwQ/Qwen3's JSON calls (vLLM: hermes' class)
    Row("qwen3", "qwen3_coder", "qwen3", "qwen3_coder"),
    Row("qwen3", "qwen3_xml", "qwen3", "qwen3_coder"),
    Row("deepseek_v3", "deepseek_v3", "deepseek_r1", "deepseek_v3", thinking_switch=False),
    Row("deepseek_v3", "deepseek_v31", "deepseek_v3", "deepseek_v31"),
    # V3.1's thinking mode: vLLM's deepseek_v3 reasoning parser reads reasoning only when the
    # request (or the server's defaults) says `thinking`; off, the think block is content.
    Row("deepseek_v3", "deepseek_v31", "deepseek_v3", "deepseek_v31", variant="thinking", thinking_off=THINKING_OFF, serve_flags=THINKING_ON),
    Row("kimi_k2", "kimi_k2", "kimi_k2", "kimi_k2"),
    Row("glm45", "glm45", "glm45", "glm45"),
    Row("glm45", "glm47", "glm47", "glm47"),
    Row("seed_oss", "seed_oss", "seed_oss", "seed_oss"),
    Row("minimax_m2", "minimax_m2", "minimax_m2", "minimax_m2"),
    Row("llama3", "llama3_json", None, "llama3_json"),
    Row("llama3", "llama4_json", None, "llama3_json"),
    Row(
        "mistral",
        "mistral",
        "mistral",
        "mistral",
        forced_json_unread=(
            "for required and named vLLM's render forces a bare JSON list of `{name, arguments}` (its schema for a "
            "Mistral tokenizer before v11 and for any HF-mode one), but with `[ARGS]` in the vocabulary its mistral "
            "parser reads only `[TOOL_CALLS]name[ARGS]{...}` calls: the forced list stays content, with no call"
        ),
    ),
    # As vLLM serves Mistral's own checkpoints: mistral_common's tokenizer (NeMo's tekken.json, v3: no
    # [THINK]) renders the prompt; its calls are the pre-v11 JSON list (tests/support/parser_matrix/mistral_mode.py).
    Row(
        mistral_mode.FAMILY,
        "mistral",
        None,
        "mistral_v3",
        refused_at_render=mistral_mode.REFUSED_AT_RENDER,
        variant="tokenizer-mode-mistral",
        serve_flags=mistral_mode.SERVE_FLAGS,
        stop_string_loses_call=mistral_mode.LOSES_CALL,
    ),
    # As vLLM serves Command models: cohere_melody renders the prompt (cmd4's unless told cmd3).
    Row(
        "cohere",
        "cohere_command3",
        "cohere_command3",
        "cohere_command3",
        serve_flags=("--tokenizer-mode", "cohere", "--default-chat-template-kwargs", '{"cohere_format": "cmd3"}'),
    ),
    Row("cohere", "cohere_command4", "cohere_command4", "cohere_command4", serve_flags=("--tokenizer-mode", "cohere")),
    Row("qwen3_hf", "hf", "hf", "hermes", refused_at_render=HF_REFUSES_FORCED_CALLS),
    # 0.33's BeamParser: the response_template parser with its own streaming (vllm/parser/beam.py).
    Row("qwen3_hf", "beam", "beam", "hermes", refused_at_render=HF_REFUSES_FORCED_CALLS, lines=("0.33",)),
    # Hunyuan's templates switch thinking with reasoning_effort: Hy3's is off unless asked (so served
    # with a default, as its model card says to send one), Hy4's is on.
    Row(
        "hy3",
        "hy_v3",
        "hy_v3",
        "hy_v3",
        thinking_off=NO_THINK,
        serve_flags=("--default-chat-template-kwargs", '{"reasoning_effort": "high"}'),
        stop_string_loses_call=(
            "vLLM's streaming hy_v3 parser opens a call only when `<tool_calls:opensource>` is whole in one "
            "delta's text; with the text held back behind the token ids it never is, and the call is lost"
        ),
    ),
    Row("hy4", "hy_v4", "hy_v4", "hy_v4", thinking_off=NO_THINK),
    Row("jamba", "jamba", None, "jamba"),
    Row("lfm2", "lfm2", None, "lfm2"),
    Row("k2_horizon", "k2_horizon", "k2_horizon", "k2_horizon"),
    Row("minimax_m3", "minimax_m3", "minimax_m3", "minimax_m3"),
    # Laguna's calls are GLM-4.5's; its reasoning parser is deepseek_v3's (thinking when asked).
    Row("poolside_v1", "poolside_v1", "poolside_v1", "glm45", serve_flags=("--default-chat-template-kwargs", '{"enable_thinking": true}')),
    # Granite 3.x's call list, and Granite 3.2's plain-text thought markers (granite reasoning)
    # on a row of their own: vLLM composes no working pair of the two (its stream sends the calls
    # as content whenever the granite reasoning parser runs beside the tool parser).
    Row("granite", "granite", None, "granite"),
    Row("granite", None, "granite", "granite"),
    Row("granite", "granite-20b-fc", None, "granite_20b_fc"),
    # Granite 4.0 writes hermes' calls; Granite 4.2 and Nemotron V3 think in <think> and write
    # Qwen3-Coder's XML calls (vLLM's granite_thinking_parser is nemotron_v3's with content stripped).
    Row("qwen3", "granite4", None, "hermes"),
    Row("qwen3", "qwen3_coder", "granite_thinking_parser", "qwen3_coder"),
    Row("qwen3", "qwen3_coder", "nemotron_v3", "qwen3_coder"),
    Row("llama3", "pythonic", None, "pythonic"),
    Row("llama4", "llama4_pythonic", None, "llama4_pythonic"),
    Row("qwen3", "olmo3", "olmo3", "olmo3"),
    # DeepSeek's DSML calls, as text on V3's vocabulary. V4 and V4.1 think unless told `thinking`
    # false; V3.2's reasoning is V3's (deepseek_v3 parser, thinking when asked).
    Row("deepseek_v3", "deepseek_v32", "deepseek_v3", "deepseek_v32", thinking_off=THINKING_OFF, serve_flags=THINKING_ON),
    Row("deepseek_v3", "deepseek_v4", "deepseek_v4", "deepseek_v4", thinking_off=THINKING_OFF),
    Row("deepseek_v3", "deepseek_v41", "deepseek_v41", "deepseek_v41", thinking_off=THINKING_OFF),
    Row("kimi_k3", "kimi_k3", "kimi_k3", "kimi_k3"),
    Row("qwen3", "phi4_mini_json", None, "phi4_mini_json"),
    # InternLM2: one plugin action per turn; vLLM's batch parser raises on a cut one (an error answer, asserted).
    Row(
        "internlm",
        "internlm",
        None,
        "internlm",
        stop_string_loses_call=(
            "vLLM's streaming internlm parser sends text as content while `<|action_start|>` is not whole in the "
            "text so far, then looks for the action only after what it sent; with the text held back behind the "
            "token ids, the marker's first part went out as content, and the action is never found"
        ),
    ),
    Row("longcat", "longcat", None, "longcat"),
    Row("dots", "dots", None, "dots"),
    Row("apertus", "apertus", None, "apertus"),
    Row("qwen3", "xlam", None, "xlam"),
    Row("gigachat3", "gigachat3", None, "gigachat3"),
    # Step-3 always thinks (vLLM's step3 reasoning parser: everything before `</think>`; no off switch).
    Row(
        "step3",
        "step3",
        "step3",
        "step3",
        thinking_switch=False,
        stop_string_loses_call=(
            "vLLM's streaming step3 reasoning parser ends the thought when `</think>`'s id arrives but cuts that "
            "delta's text, which the stop string's buffer has shifted against the ids: `/think>` and the call "
            "block after it go out as content, and the tool parser never sees the block open"
        ),
    ),
    # ERNIE 4.5 Thinking always thinks: vLLM's ernie45 reasoning parser reads everything before
    # `</think>` as reasoning, whatever chat_template_kwargs say (no off switch).
    Row("ernie45", "ernie45", "ernie45", "ernie45", thinking_switch=False),
    # vLLM picks HarmonyParser for a gpt_oss model whatever the flags; these are the flags it documents.
    Row("gpt_oss", "openai", "openai_gptoss", "harmony", thinking_switch=False),
    # Inkling: typed blocks; the thinking block is the model's choice (vLLM's parser reads no switch).
    Row("inkling", "inkling", "inkling", "inkling", thinking_switch=False),
    # Ling3 writes GLM-4.7's calls (vLLM's Ling3Parser is Glm47MoeParser's) and thinks unless told
    # `thinking` or `enable_thinking` false.
    Row("glm45", "ling3", "ling3", "glm47"),
    Row("muse_glimmer", "muse_glimmer", "muse_glimmer", "muse_glimmer", thinking_switch=False),
    Row("plamo3", "plamo3", "plamo3", "plamo3"),
    # Step-3.5's template always opens `<think>`: vLLM's step3p5 parser ignores enable_thinking.
    Row("qwen3", "step3p5", "step3p5", "step3p5", thinking_switch=False),
    # Hunyuan A13B thinks unless told not to (enable_thinking false, or /no_think): then it writes the
    # empty think block, which vLLM's parser knows by its token ids as well.
    Row(
        "hunyuan_a13b",
        "hunyuan_a13b",
        "hunyuan_a13b",
        "hunyuan_a13b",
        grammar_never_applied=(
            "vLLM's structured-output gate asks the hunyuan_a13b reasoning parser's is_reasoning_end, which reads a "
            "state only its streaming extraction moves (the engine's own parser instance never streams), so the "
            "reasoning never ends for the grammar and guided decoding never starts"
        ),
        stop_string_loses_call=(
            "vLLM's streaming hunyuan_a13b reasoning parser switches on each delta's token id but sends that delta's "
            "text, which the stop string's buffer has shifted against the ids: the tags go out as reasoning "
            "(`think>\\n`) and content (`nswer>\\n`), and the tool parser never sees the answer start with `<tool_calls>`"
        ),
    ),
    # vLLM 0.33's Muse (Muse Spark; musespark1x is the same parsers): channel-scoped messages, calls as ATEM
    # invokes in tool channels. Reasoning is the `to=self` channel, which the model writes or not (no switch).
    Row("muse", "muse", "muse", "muse", thinking_switch=False, lines=("0.33",)),
    Row("muse", "musespark1x", "musespark1x", "muse", thinking_switch=False, lines=("0.33",)),
    # vLLM 0.33's Step-5: Qwen3-Coder's XML calls (content whitespace kept) in Qwen's vocabulary; its
    # reasoning parser is DeepSeek-R1's (everything before `</think>` is reasoning: no off switch).
    Row("qwen3", "step5", "step5", "qwen3_coder", thinking_switch=False, lines=("0.33",)),
    # Gemma 4 thinks when asked (enable_thinking, which vLLM's gemma4 parser reads too): served thinking.
    Row("gemma4", "gemma4", "gemma4", "gemma4", serve_flags=("--default-chat-template-kwargs", '{"enable_thinking": true}')),
    Row("functiongemma", "functiongemma", None, "functiongemma"),
    # MiMo and MiniCPM-V 4.5 write on Qwen's vocabulary (the demo's <think> and <tool_call>); Holo2 is
    # Qwen3-VL with hermes' calls, and its reasoning parser DeepSeek V3's, thinking unless told not to.
    Row("qwen3", "mimo", "mimo", "mimo"),
    Row("qwen3", "qwen3_coder", "minicpmv", "qwen3_coder"),
    Row("qwen3", "hermes", "holo2", "hermes"),
    Row("minicpm5", "minicpm5", None, "minicpm5", stop_string_loses_call=MINICPM5_LOSES_CALL),
    # MiniMax M2 always thinks, in a block its template opens (the parser gives it back as content).
    Row("minimax_m2", "minimax_m2", "minimax_m2_append_think", "minimax_m2_opened", thinking_switch=False),
]

ROWS = [row for row in ALL_ROWS if LINE in row.lines]  # the rows of this process's line

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
    # With `differs`: why vLLM's stream lost the call there (then its finish_reason is `stop`, ours
    # `tool_calls`, and that is asserted instead of equal finish_reasons).
    lost_call: str | None = None
    # A required or named tool_choice: the reasoning before the call. Where vLLM's render forces JSON,
    # the test scripts this and the JSON (forced_json); where it forces none, `text` (the family's markup).
    guided: str | None = None


def forced_json(schema: dict[str, Any], named: bool) -> str:
    """What guided decoding makes the model write under `schema`, the JSON schema vLLM's render installs
    for tool_choice required or named: a list of call objects (their keys as the schema names them:
    `parameters` for vLLM's own, `arguments` for Mistral's), or the named tool's arguments object."""
    calls = [("get_weather", WEATHER_ARGS)] + ([] if named else [("search", SEARCH_ARGS)])
    if schema.get("type") != "array":
        return json.dumps(WEATHER_ARGS, ensure_ascii=False)
    branches = schema["items"].get("anyOf", [schema["items"]])

    def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
        branch = next(b for b in branches if name in b["properties"]["name"].get("enum", [b["properties"]["name"].get("const")]))
        return {"name": name, next(k for k in branch["required"] if k != "name"): args}

    return json.dumps([call(n, a) for n, a in calls[: schema.get("maxItems", len(calls))]], ensure_ascii=False)


STOP_STRINGS = "vllm-differences.md#derender-stop-string-alignment"


def cases(row: Row) -> list[Case]:
    f = FORMATS[row.format]
    several = [("get_weather", WEATHER_ARGS), ("search", SEARCH_ARGS)][: f.calls_per_turn]
    both = f.calls(several)
    one = f.calls([("get_weather", WEATHER_ARGS)])
    think = f.think("The user wants the weather; I will call the tools.") if row.reasoning_parser else ""
    bare = f.opening  # how an output without a thought starts (Hunyuan A13B: an empty think block)
    out = [Case("reasoning_then_content", (think or "") + f.content("It is sunny in Zürich."))]
    if row.tool_parser:
        tools = {"tools": TOOLS}
        out += [
            Case("reasoning_then_two_calls", think + both, tools, tuple(n for n, _ in several)),
            Case("content_around_calls", bare + f.preamble("Let me check.") + one + f.after_calls("Done."), tools),
            Case("call_cut_by_length", bare + one, {**tools, "max_tokens": f.cut_at}),
            Case("stop_string_inside_markup", think + one, {**tools, "stop": ["Altstadt"]}, differs=STOP_STRINGS, lost_call=row.stop_string_loses_call),
            *_forced_choices(think, f.forced_prefix + one, tools),
            Case("tool_choice_none", bare + f.content("No tools needed."), {**tools, "tool_choice": "none"}),
        ]
        if row.thinking_switch:
            out.append(Case("thinking_off_then_call", bare + one, {**tools, "chat_template_kwargs": dict(row.thinking_off)}, ("get_weather",)))
    return out


NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _forced_choices(think: str, one: str, tools: dict[str, Any]) -> list[Case]:
    """tool_choice required and named: a thinking model reasons first (guided decoding applies after the
    reasoning ends; a prompt that opens the reasoning leaves the model no other way), then writes what vLLM
    forces: the JSON of its render's schema (the test fills it in), or the family's markup where it forces
    none, which vLLM reads with the parser as under auto: it must find the call after the reasoning."""
    chats = (("tool_choice_required", {**tools, "tool_choice": "required"}), ("tool_choice_named", {**tools, "tool_choice": NAMED}))
    # Guided decoding's JSON grammar takes over right after the reasoning's end: no blank line before it.
    return [Case(name, think + one, chat, ("get_weather",), guided=think.rstrip()) for name, chat in chats]
