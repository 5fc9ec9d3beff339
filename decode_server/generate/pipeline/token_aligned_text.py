"""Text and token ids in step for a streaming parser, when stop strings hold text back.

With stop strings, vLLM's detokenizer keeps the last `max(len(stop)) - 1` characters of a
stream back (a stop string may still complete there) but releases every token id at once.
vLLM's parsers read both: they see `</think>` or `<tool_call>` by id while its text is still
held back, and route the text that follows wrongly — tag fragments in `content`, a stray `}` in
the arguments — by an amount that depends on how engine steps were merged before the frontend
read them (vLLM #36830 and #51641, open against 0.32; coupled chat has the same fault).

The aligner holds back ids instead of letting them run ahead: it decodes each id as the engine
does (token_text_ends.py) to learn where its text ends, and releases an id to the parser once the
engine has released all of its text, cut into one piece per id — what the parser would have been
fed without a stop string, however the engine's steps were merged. The engine's text is what the
parser reads; at the end every id left goes with the rest of it.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from vllm.sampling_params import SamplingParams

from decode_server.generate.pipeline.token_text_ends import Piece, TokenTextEnds, per_token


def holds_text_back(sp: SamplingParams) -> bool:
    """The engine's stop buffer is longer than zero (vLLM's `stop_buffer_length` rule)."""
    return bool(sp.stop) and not sp.include_stop_str_in_output and max(len(s) for s in sp.stop) > 1


class TokenAlignedText:
    """One choice's stream: engine deltas in, per-id pieces the parser can trust out."""

    __slots__ = ("_ends", "_pending_ids", "_pending_ends", "_held_text", "_given")

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], sp: SamplingParams):
        self._ends = TokenTextEnds(tokenizer, prompt_token_ids, sp)
        self._pending_ids: list[int] = []
        self._pending_ends: list[int] = []  # where each pending id's text ends, in output characters
        self._held_text = ""  # released by the engine, not yet given to the parser
        self._given = 0  # output characters given to the parser

    def step(self, text: str, token_ids: list[int], finished: bool) -> list[Piece]:
        """The pieces this engine delta releases (none while every id waits for its text; at
        least one when finished, which the parser must see)."""
        for token_id in token_ids:
            self._pending_ids.append(token_id)
            self._pending_ends.append(self._ends.end_of(token_id))
        self._held_text += text
        if finished:
            out = per_token(self._held_text, self._pending_ids, self._pending_ends, self._given)
            self._pending_ids, self._pending_ends, self._held_text = [], [], ""
            return out or [("", [])]
        released = bisect_right(self._pending_ends, self._given + len(self._held_text))
        if not released:
            return []
        cut = self._pending_ends[released - 1] - self._given
        out = per_token(self._held_text[:cut], self._pending_ids[:released], self._pending_ends[:released], self._given)
        self._held_text = self._held_text[cut:]
        del self._pending_ids[:released], self._pending_ends[:released]
        self._given += cut
        return out
