"""SSE framing of one chunk: `data: {json}\\n\\n`, as vLLM writes it (and `[DONE]` at the end).

Here, not in http/, because a stream's chunks are framed where its engine step is processed
(generate/one_pass.py): its writer then sends bytes only.
"""

from __future__ import annotations

from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"


def frame(obj: Any) -> bytes:
    return b"data: " + _encoder.encode(obj) + b"\n\n"
