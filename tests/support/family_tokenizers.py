"""Demo model directories shaped like other model families, for parser tests and demos.

Each family is the demo model (decode_server/tools/demo_model.py: Qwen's BPE, config, ChatML
template) plus the special tokens that family's reasoning and tool parsers look up in the
vocabulary, with the `special` flag the family's own tokenizer gives them (a special token is
dropped from text under skip_special_tokens, so the flag decides what a parser sees). The
weights stay random: only the vocabulary and template matter to parsing.

A family keeps every id of the demo vocabulary but only its first MERGES merges: any id still
decodes to the same text, and text encodes into finer pieces (more, smaller deltas to parse).
Loading the full merge list is what makes a tokenizer slow here (transformers keeps it in Python,
vLLM's tokenizer pool deep-copies it): seconds per load, against a tenth of that.
"""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from decode_server.tools.demo_model import build_demo_model, write_model_dir


QWEN3_RESPONSE_TEMPLATE = {
    "version": 1,
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "thinking": {"open": "<think>", "close": "</think>", "optional": True},
        "content": {},
        "tool_calls": {
            "open": "<tool_call>",
            "close": "</tool_call>",
            "content": "json",
            "repeats": True,
            "optional": True,
            "transform": {"type": "function", "function": "{content}"},
        },
    },
}


@dataclass(frozen=True)
class Family:
    name: str
    added: tuple[tuple[str, bool], ...]  # (token, special), appended after the demo's added tokens
    chat_template: str | None = None  # None: the demo's ChatML template
    config: dict = field(default_factory=dict)  # config.json overrides
    tokenizer_config: dict = field(default_factory=dict)  # tokenizer_config.json additions
    # (demo token, family token): a demo added token whose id the family's token takes, where the
    # family's vocabulary has no such token and a parser would find it (Hunyuan reads its token
    # suffix off the first structural token in the vocabulary: a bare <tool_call> would say "none").
    renamed: tuple[tuple[str, str], ...] = ()
    # Demo added tokens the family's vocabulary does not have (its model writes them as text, in
    # BPE pieces): dropped, so that text encodes as the family's would.
    not_tokens: tuple[str, ...] = ()
    # (BPE piece, id): the family's ids for pieces a parser matches by id, each swapped with the demo
    # piece that held that id (the same texts, numbered as the family's vocabulary numbers them).
    renumbered: tuple[tuple[str, int], ...] = ()
    # BPE merges the family's vocabulary applies and the truncated merge list lacks (appended last).
    merges: tuple[tuple[str, str], ...] = ()


# Tencent Hunyuan (Hy3, Hy4): every structural token carries the checkpoint's suffix, and the bare
# forms are no tokens at all. Not special: vLLM's hy_v3/hy_v4 parsers read them in the text under
# the default skip_special_tokens.
HY = ":opensource"
HY_RENAMED = tuple((t, t.replace(">", f"{HY}>")) for t in ("<tool_call>", "</tool_call>", "<think>", "</think>"))
HY_ADDED = tuple((f"<{t}{HY}>", False) for t in ("tool_calls", "/tool_calls", "arg_key", "/arg_key", "arg_value", "/arg_value"))
# MiniMax M3's namespace marker, before every structural tag of a call, and its thinking block.
MINIMAX_M3_NS = "]<]minimax[>["
# Inkling's block markers: the role, the content kinds, the block ends.
INKLING_TOKENS = tuple(
    f"<|{t}|>"
    for t in (
        "message_model", "content_text", "content_thinking", "content_invoke_tool_json", "content_invoke_tool_text",
        "content_tool_error", "content_model_end_sampling", "end_message",
    )
)
# Muse's turns: `<|start|>ROLE<|message|>...<|eot|>`, the prompt ending with `<|start|>assistant` (the model
# writes ` to=RECIPIENT<|message|>` next, as vLLM's muse parsers expect).
MUSE_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content or '' }}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("qwen3", ()),  # the demo model itself: hermes, qwen3_coder/qwen3_xml, qwen3 reasoning
        Family(
            "deepseek_v3",
            tuple(
                (t, False)
                for t in (
                    "<｜tool▁calls▁begin｜>",
                    "<｜tool▁calls▁end｜>",
                    "<｜tool▁call▁begin｜>",
                    "<｜tool▁call▁end｜>",
                    "<｜tool▁sep｜>",
                    "<｜tool▁outputs▁begin｜>",
                    "<｜tool▁outputs▁end｜>",
                )
            ),
        ),
        Family(
            "kimi_k2",
            tuple(
                (t, True)
                for t in (
                    "<|tool_calls_section_begin|>",
                    "<|tool_calls_section_end|>",
                    "<|tool_call_begin|>",
                    "<|tool_call_argument_begin|>",
                    "<|tool_call_end|>",
                )
            ),
        ),
        Family("glm45", tuple((t, False) for t in ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"))),
        Family("llama3", (("<|python_tag|>", True), ("<|eom_id|>", True))),
        # Llama 4: pythonic calls between special python markers.
        Family("llama4", (("<|python_start|>", True), ("<|python_end|>", True))),
        # IBM Granite 3.x: <|tool_call|> is one special token (vLLM's granite parser reads it by id,
        # with skip_special_tokens off); its thinking markers are plain text.
        Family("granite", (("<|tool_call|>", True),)),
        # Moonshot Kimi K3: XTML channels built from three special tokens (vLLM's kimi_k3 parsers
        # decode with skip_special_tokens off and find the markers as id subsequences).
        Family("kimi_k3", tuple((t, True) for t in ("<|open|>", "<|close|>", "<|sep|>"))),
        # InternLM2: the action markers are special (vLLM's internlm parser turns skipping off).
        Family("internlm", tuple((t, True) for t in ("<|action_start|>", "<|action_end|>", "<|plugin|>"))),
        Family(
            "seed_oss",
            tuple((t, False) for t in ("<seed:think>", "</seed:think>", "<seed:tool_call>", "</seed:tool_call>")),
        ),
        Family("minimax_m2", (("<minimax:tool_call>", False), ("</minimax:tool_call>", False))),
        # M3's markers are non-special added tokens (vLLM's minimax_m3 parser says so).
        Family("minimax_m3", tuple((t, False) for t in (MINIMAX_M3_NS, "<mm:think>", "</mm:think>"))),
        # Hy3 names its suffix in tokenizer_config.json (`token_suffix`, read by vLLM's hy_v3 parsers)
        # and writes <tool_sep> after a call's name; Hy4 has no <tool_sep>, and vLLM reads its
        # suffix from the vocabulary.
        Family("hy3", (*HY_ADDED, (f"<tool_sep{HY}>", False)), tokenizer_config={"token_suffix": HY}, renamed=HY_RENAMED),
        Family("hy4", HY_ADDED, renamed=HY_RENAMED),
        # AI21 Jamba: the call list between <tool_calls> tokens, special (vLLM's jamba parser turns
        # skip_special_tokens off for them).
        Family("jamba", (("<tool_calls>", True), ("</tool_calls>", True))),
        # Liquid LFM2 / LFM2.5: pythonic calls between special sentinels (vLLM's lfm2 parser turns
        # skip_special_tokens off for them).
        Family("lfm2", tuple((t, True) for t in ("<|tool_call_start|>", "<|tool_call_end|>", "<|tool_list_start|>", "<|tool_list_end|>"))),
        # K2 Horizon (IFM): a think block per reasoning effort and XML calls, all in the <ifm|...>
        # namespace; not special (vLLM's k2_horizon parsers read them in the text as decoded).
        Family(
            "k2_horizon",
            tuple(
                (f"<{close}ifm|{t}>", False)
                for t in ("think", "think_fast", "think_faster", "tool_calls", "tool_call", "arg_key", "arg_type", "arg_value")
                for close in ("", "/")
            ),
        ),
        # Poolside Laguna: <think> and GLM-4-style calls (the demo's <think>, <tool_call> and these,
        # none special: vLLM's parser says so) and the <assistant> turn token, special like the
        # family's other role tokens, that ends vLLM's backward search for </think> in the prompt.
        Family("poolside_v1", (*((t, False) for t in ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")), ("<assistant>", True))),
        # The demo model with a transformers `response_template` (vLLM's `hf` parser reads it): Qwen3's
        # reasoning and hermes calls described as fields instead of by a parser class.
        Family("qwen3_hf", (), tokenizer_config={"response_template": QWEN3_RESPONSE_TEMPLATE}),
        # Meituan LongCat-Flash: hermes' JSON calls between its own tags (vLLM's longcat parser is hermes'
        # class with them), plain added tokens that the parser finds in the text.
        Family("longcat", (("<longcat_tool_call>", False), ("</longcat_tool_call>", False))),
        # Baidu ERNIE 4.5 (thinking): </think>, then the answer in a <response> block or the calls in
        # hermes-like <tool_call> blocks; the demo vocabulary has the think and tool_call tags, not
        # the response tags, which the parsers find in the text as written.
        Family("ernie45", (("<response>", False), ("</response>", False))),
        # rednote dots.llm1: calls as XML invokes in a <dots_function_call> block (vLLM's dots parser finds
        # the tags in the text).
        Family("dots", (("<dots_function_call>", False), ("</dots_function_call>", False))),
        # Swiss AI Apertus: one JSON list of calls between special tokens (vLLM's apertus parser turns
        # skip_special_tokens off for them).
        Family("apertus", (("<|tools_prefix|>", True), ("<|tools_suffix|>", True))),
        # StepFun Step-3: DeepSeek-like call markers with full-width bars, special (vLLM's step3 parser
        # turns skip_special_tokens off for them), around StepTML invokes written as text.
        Family("step3", tuple((f"<｜{t}｜>", True) for t in ("tool_calls_begin", "tool_calls_end", "tool_call_begin", "tool_call_end", "tool_sep"))),
        # Sber GigaChat 3: a call is a role turn after <|message_sep|> (`function call<|role_sep|>` and the
        # JSON); special (vLLM's gigachat3 parser turns skip_special_tokens off).
        Family("gigachat3", tuple((t, True) for t in ("<|message_sep|>", "<|role_sep|>", "<|function_call|>"))),
        # Mistral's control tokens (v11+ calls: [TOOL_CALLS]name[ARGS]{...}; v13+ reasoning: [THINK]...[/THINK]).
        Family("mistral", tuple((t, True) for t in ("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]"))),
        # Cohere Command (Command A / R7B: cmd3; Command A Reasoning: cmd4): the markers cohere_melody's
        # cmd3/cmd4 filters split on, and the chatbot turn token vLLM's reasoning parser looks up. All
        # special in Cohere's tokenizers; vLLM's Cohere parser decodes with skip_special_tokens off.
        # A Cohere2 architecture: the parser builds its tool-call structural tag per architecture.
        Family(
            "cohere",
            tuple(
                (t, True)
                for t in (
                    "<|CHATBOT_TOKEN|>",
                    "<|START_THINKING|>",
                    "<|END_THINKING|>",
                    "<|START_ACTION|>",
                    "<|END_ACTION|>",
                    "<|START_RESPONSE|>",
                    "<|END_RESPONSE|>",
                    "<|START_TEXT|>",
                    "<|END_TEXT|>",
                )
            ),
            config={"architectures": ["Cohere2ForCausalLM"]},
        ),
        # Inkling: every block marker is a dedicated special token (vLLM's inkling parser says so, and
        # its engine turns skip_special_tokens off to read them in the text).
        Family("inkling", tuple((t, True) for t in INKLING_TOKENS)),
        # PLaMo 3: each marker is three tokens, `<|plamo:begin_` or `<|plamo:end_`, the name as text,
        # `:plamo|>`; the two ends and `<|plamo:tag|>` (end of turn) are special (vLLM's plamo3 parser
        # keeps the pieces from its engine's special-token dropping). `<|plamo:constrain|>` and
        # `<|plamo:msg|>` sit inside one terminal literal, so they are not special (the engine would
        # drop them and never see the arguments open).
        Family(
            "plamo3",
            (*((t, True) for t in ("<|plamo:begin_", "<|plamo:end_", ":plamo|>", "<|plamo:tag|>")), ("<|plamo:constrain|>", False), ("<|plamo:msg|>", False)),
        ),
        # MuseGlimmer: the channel framing tokens are special (vLLM's muse_glimmer parsers turn
        # skip_special_tokens off because the default strips them); the ATEM tags are text.
        Family("muse_glimmer", tuple((t, True) for t in ("<|start|>", "<|message|>", "<|eom|>", "<|eot|>"))),
        # Tencent Hunyuan A13B: `<think>`, `<answer>` and `<tool_calls>` are text, not tokens, and vLLM's
        # hunyuan_a13b reasoning parser streams by matching their BPE pieces by Hunyuan's own ids
        # (`<think>\n` = 14023 771 397, `\n</think>\n<answer>\n` = 198 524 27963 397 27 9399 397, its
        # fast-think forms with `>\n\n` = 1363): the pieces get those ids, and the merges that make
        # Hunyuan's pieces (its BPE splits `<think` as `<th` `ink`, keeps `think` whole).
        Family(
            "hunyuan_a13b",
            (),
            not_tokens=("<think>", "</think>"),
            renumbered=(("<th", 14023), ("ink", 771), (">ĊĊ", 1363), ("</", 524), ("think", 27963), ("answer", 9399)),
            merges=(("<", "th"), ("th", "ink")),
        ),
        # Muse (Muse Spark; vLLM 0.33's muse/musespark1x parsers): channel-scoped messages framed by
        # special tokens (the parsers turn skip_special_tokens off to see them); the ATEM call tags are text.
        Family("muse", tuple((t, True) for t in ("<|start|>", "<|message|>", "<|eom|>", "<|eot|>")), chat_template=MUSE_TEMPLATE),
        # Google Gemma 4: channel, tool-call, string-quote and turn tokens, all special (vLLM's gemma4
        # parser decodes with skip_special_tokens off and finds them by id and in the text).
        Family("gemma4", tuple((t, True) for t in ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|turn>", "<|tool_response>"))),
        # Google FunctionGemma: its function-call and <escape> tokens, special (vLLM's functiongemma
        # parser turns skip_special_tokens off for them).
        Family(
            "functiongemma",
            tuple((t, True) for t in ("<start_function_call>", "<end_function_call>", "<escape>", "<start_function_response>", "<end_function_response>")),
        ),
        # OpenBMB MiniCPM5: the call tags are special tokens (vLLM's minicpm5 parser turns
        # skip_special_tokens off for them and mends `<functionname=`, the decode of `<function`
        # followed by ` name`), the rest of each element plain text.
        Family("minicpm5", tuple((t, True) for t in ("<function", "</function>", "<param", "</param>"))),
    )
}


MERGES = 30_000


@functools.lru_cache(maxsize=2)
def _truncated_json(base: Path) -> str:
    spec = json.loads((base / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["merges"] = spec["model"]["merges"][:MERGES]
    return json.dumps(spec, ensure_ascii=False)


def _truncated(base: Path, family: Family | None = None) -> "Tokenizer":  # noqa: F821
    from tokenizers import Tokenizer

    text = _truncated_json(Path(base).resolve())
    family = family or Family("", ())
    if not (family.renamed or family.not_tokens or family.renumbered or family.merges):
        return Tokenizer.from_str(text)
    spec, names = json.loads(text), dict(family.renamed)
    for token in spec["added_tokens"]:
        token["content"] = names.pop(token["content"], token["content"])
    dropped = [t for t in spec["added_tokens"] if t["content"] in family.not_tokens]
    # Only the last added ids may go: a gap would leave ids that decode to nothing.
    if names or len(dropped) != len(family.not_tokens) or spec["added_tokens"][len(spec["added_tokens"]) - len(dropped) :] != dropped:
        raise RuntimeError(f"{family.name}: not the demo vocabulary's (last) added tokens: {sorted(names)} {family.not_tokens}")
    spec["added_tokens"] = spec["added_tokens"][: len(spec["added_tokens"]) - len(dropped)]
    vocab = spec["model"]["vocab"]
    by_id = {i: piece for piece, i in vocab.items()}
    for piece, new_id in family.renumbered:
        vocab[by_id[new_id]], vocab[piece] = vocab[piece], new_id
        by_id[vocab[by_id[new_id]]] = by_id[new_id]
        by_id[new_id] = piece
    spec["model"]["merges"] += [list(m) for m in family.merges]
    return Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))


def build_family_model(family: str, target: Path, base: Path | None = None) -> Path:
    """Write `family`'s demo model directory to `target` unless it is already there; `base` is a
    demo model directory to start from (built next to `target` when not given)."""
    spec = FAMILIES[family]
    if spec == Family(family, ()):
        return base or build_demo_model(target)  # the demo model itself, full merges
    if (Path(target) / "config.json").is_file():
        return Path(target)
    base = base or build_demo_model(Path(target).parent / ".demo-base")
    return write_model_dir(target, lambda tmp: _write_family(spec, Path(base), tmp))


def _write_family(spec: Family, base: Path, tmp: Path) -> None:
    from tokenizers import AddedToken

    shutil.copy(base / "generation_config.json", tmp / "generation_config.json")
    tok = _truncated(base, spec)
    first = tok.get_vocab_size()
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in spec.added])
    for i, (text, _) in enumerate(spec.added):
        if tok.token_to_id(text) != first + i:
            raise RuntimeError(f"{spec.name}: {text} did not get a new id (already in the vocabulary?)")
    tok.save(str(tmp / "tokenizer.json"))
    config = json.loads((base / "config.json").read_text()) | spec.config
    if first + len(spec.added) > config["vocab_size"]:
        raise RuntimeError(f"{spec.name}: the added tokens overflow the embedding size")
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok_config = json.loads((base / "tokenizer_config.json").read_text())
    tok_config["additional_special_tokens"] += [t for t, s in spec.added if s]
    if spec.chat_template is not None:
        tok_config["chat_template"] = spec.chat_template
    tok_config |= spec.tokenizer_config
    (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
