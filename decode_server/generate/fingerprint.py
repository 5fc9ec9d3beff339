"""A fingerprint of what parsing depends on, so a render tier can detect config drift.

Covers the tokenizer vocabulary (and its added tokens), the chat template (the
tokenizer's, or --chat-template), the reasoning and tool parser names, whether auto
tool choice is on, the default chat-template kwargs and the model. Exposed in /v1/models and on
every generate response; a request that sends a different one gets 409.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from decode_server.config import DerenderConfig


def parser_fingerprint(tokenizer: Any, model: str, derender: DerenderConfig) -> str:
    h = hashlib.sha256()
    if tokenizer is not None:
        vocab = tokenizer.get_vocab()
        h.update(json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False).encode())
        h.update((derender.chat_template or getattr(tokenizer, "chat_template", None) or "").encode())
    parts = (
        model,
        derender.reasoning_parser or "",
        derender.tool_call_parser or "",
        "auto-tools" if derender.enable_auto_tool_choice else "",
        json.dumps(derender.default_chat_template_kwargs, sort_keys=True),
    )
    for part in parts:
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]
