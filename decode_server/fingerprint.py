"""A fingerprint of what parsing depends on, so a render tier can detect config drift.

Covers the tokenizer vocabulary (and its added tokens), the chat template, the
reasoning and tool parser names and the model. Exposed in /v1/models and on
every generate response; a request that sends a different one gets 409.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

HEADER = "x-parser-fingerprint"


def parser_fingerprint(
    tokenizer: Any, model: str, reasoning_parser: str | None, tool_parser: str | None
) -> str:
    h = hashlib.sha256()
    if tokenizer is not None:
        vocab = tokenizer.get_vocab()
        h.update(json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False).encode())
        h.update((getattr(tokenizer, "chat_template", None) or "").encode())
    for part in (model, reasoning_parser or "", tool_parser or ""):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]
