"""Mistral served as vLLM serves Mistral's own checkpoints: `--tokenizer-mode mistral`, a real
mistral_common tokenizer file (tekken.json) instead of an HF tokenizer.

The model directory is the demo model's config (its vocabulary size covers Tekken's 131,072 ids;
BOS and EOS are Tekken's) with Mistral NeMo's tokenizer, tekken_240718.json, which mistral_common
ships: a v3 tokenizer, so the model writes its calls as one JSON list after [TOOL_CALLS]
(vLLM's mistral parser takes its pre-v11 path) and has no [THINK] to reason in. In mistral mode
vLLM renders the prompt with mistral_common (no Jinja template), and `encode` reads text only:
a control token written in a script's text (`[TOOL_CALLS]`) is text there, so `script_of` writes
each control token as its id, as the model emits it.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from decode_server.tools.demo_model import write_model_dir

FAMILY = "mistral_tekken"
TEKKEN = "tekken_240718.json"  # Mistral NeMo (2407): Tekken v3
SERVE_FLAGS = ("--tokenizer-mode", "mistral")
# mistral_common renders the prompt: vLLM refuses any chat_template_kwargs (a 400, whatever they say).
REFUSED_AT_RENDER = (("thinking_off_then_call", "chat_template is not supported for Mistral tokenizers"),)
# families.Row.stop_string_loses_call of the row.
LOSES_CALL = (
    "vLLM's streaming mistral parser (pre-v11 path) latches on the [TOOL_CALLS] id and cuts the marker out "
    "of that delta's text; with the text held back behind the token ids, that text is `[TOOL`, which goes "
    "out as content, and the marker's rest (`_CALLS]`) reaches its JSON parser next, which fails there and on "
    "every later delta (logged, nothing sent): the call is lost"
)


def build_mistral_model(root: Path, demo_model: Path) -> Path:
    """The model directory under `root` (built once): the demo config and NeMo's tekken.json."""
    import mistral_common

    tekken = Path(mistral_common.__file__).parent / "data" / TEKKEN

    def write(tmp: Path) -> None:
        shutil.copy(tekken, tmp / "tekken.json")
        ids = {"bos_token_id": 1, "eos_token_id": 2}  # Tekken's <s> and </s>
        config = json.loads((demo_model / "config.json").read_text()) | ids
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n")

    return write_model_dir(root / f"{FAMILY}-{Path(TEKKEN).stem}", write)


def script_of(tokenizer: Any, text: str) -> list[int]:
    """The ids a model of the tokenizer's family emits for `text`: its control tokens as their
    ids. An HF tokenizer does that itself; mistral_common's encodes the text as text."""
    if not getattr(tokenizer, "IS_MISTRAL_TOKENIZER", False):
        return tokenizer.encode(text, add_special_tokens=False)
    controls = {t: tokenizer.get_vocab()[t] for t in tokenizer.all_special_tokens if t.startswith("[")}
    pieces = re.split("(" + "|".join(map(re.escape, sorted(controls, key=len, reverse=True))) + ")", text)
    script: list[int] = []
    for piece in filter(None, pieces):
        script += [controls[piece]] if piece in controls else tokenizer.encode(piece, add_special_tokens=False)
    return script
