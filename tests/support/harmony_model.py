"""A tiny gpt-oss-shaped model directory (harmony format) for parser tests and demos.

vLLM treats a model whose config says `model_type: gpt_oss` as harmony: it renders chat with
`openai_harmony` and parses output token ids with `HarmonyParser`, both on the o200k_harmony
encoding. So the Hugging Face tokenizer here must give every id harmony's meaning: o200k_base's
ranks as the BPE vocabulary (id = rank), harmony's special tokens at their ids from 199998. As
with the other families (family_tokenizers.py), only the first MERGES merges are kept: every id
decodes as in o200k, text encodes into finer pieces. Weights stay random (load_format=dummy);
the config is gpt-oss's (YaRN, sinks, sliding window, MoE), only small, so a real engine runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

from decode_server.tools.demo_model import write_model_dir
from tests.support.family_tokenizers import MERGES

# tiktoken's o200k_base split pattern (what openai_harmony uses for o200k_harmony).
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
FIRST_SPECIAL_ID = 199998
# o200k_harmony's named special tokens by id; the ids between them are <|reserved_N|>.
NAMED = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}
VOCAB_SIZE = 201088
# Bump when the generated files change, so a cached copy is not reused.
CACHE_SUBDIR = "gpt-oss-demo-v2"
RETURN, CALL, ENDOFTEXT = 200002, 200012, 199999


def _specials() -> list[str]:
    return [NAMED.get(i, f"<|reserved_{i}|>") for i in range(FIRST_SPECIAL_ID, VOCAB_SIZE)]


def _config() -> dict:
    import transformers

    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "experts_per_token": 2,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 32768,
        # gpt-oss's own YaRN parameters: vLLM's GptOssForCausalLM reads every one of them.
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
        "tie_word_embeddings": False,
        "attention_bias": True,
        "eos_token_id": RETURN,
        "pad_token_id": ENDOFTEXT,
        "dtype": "bfloat16",
        # Without a (>= 5) version here, transformers 5 suspects an old Mistral tokenizer.
        "transformers_version": transformers.__version__,
    }


def _tokenizer(o200k: Path):
    from tokenizers import AddedToken, Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(o200k), pattern=O200K_PATTERN).converted()
    if tok.get_vocab_size() != FIRST_SPECIAL_ID:
        raise RuntimeError(f"{o200k}: {tok.get_vocab_size()} ranks, not o200k_base's {FIRST_SPECIAL_ID}")
    spec = json.loads(tok.to_str())
    spec["model"]["merges"] = spec["model"]["merges"][:MERGES]
    tok = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    specials = _specials()
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for i, text in enumerate(specials):
        if tok.token_to_id(text) != FIRST_SPECIAL_ID + i:
            raise RuntimeError(f"{text} did not get id {FIRST_SPECIAL_ID + i}")
    return tok


def _write(o200k: Path, tmp: Path) -> None:
    _tokenizer(o200k).save(str(tmp / "tokenizer.json"))
    files = {
        "config.json": _config(),
        "generation_config.json": {"eos_token_id": [RETURN, ENDOFTEXT, CALL], "pad_token_id": ENDOFTEXT},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|startoftext|>",
            "eos_token": "<|return|>",
            "pad_token": "<|endoftext|>",
            "model_max_length": 131072,
            "clean_up_tokenization_spaces": False,
        },
    }
    for name, data in files.items():
        (tmp / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def build_harmony_model(target: Path, o200k: Path) -> Path:
    """Write the gpt-oss demo model to `target` unless it is there; `o200k` is o200k_base.tiktoken."""
    return write_model_dir(target, lambda tmp: _write(Path(o200k), tmp))
