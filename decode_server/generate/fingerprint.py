"""A fingerprint of what parsing depends on, so a render tier can detect config drift.

Covers the tokenizer vocabulary (and its added tokens), the chat template (the
tokenizer's, or --chat-template), the reasoning and tool parser names, whether auto
tool choice is on, the default chat-template kwargs and the model. Exposed in /v1/models and on
every generate response; a request that sends a different one gets 409.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import Any

from decode_server.config import DerenderConfig


# Hashing a 150k-entry vocabulary costs most of a second: the hash state after it is kept per
# tokenizer object and copied, so every service over the same tokenizer shares it and the value
# stays what it always was.
_after_vocab: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _hash_after_vocab(tokenizer: Any) -> Any:
    state = _after_vocab.get(tokenizer)
    if state is None:
        vocab = tokenizer.get_vocab()
        state = hashlib.sha256(json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False).encode())
        _after_vocab[tokenizer] = state
    return state.copy()


def parser_fingerprint(tokenizer: Any, model: str, derender: DerenderConfig) -> str:
    if tokenizer is None:
        h = hashlib.sha256()
    else:
        h = _hash_after_vocab(tokenizer)
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
