"""Where each output id's text ends, and the per-id pieces a step with several ids is cut into.

vLLM's parsers are written for one id per delta: fed several at once (merged engine steps: a
client's `stream_interval`, AsyncLLM merging the steps a slow reader has not taken yet, or ids a
stop string's buffer released together) some of them misroute text — granite loses its reasoning,
deepseek_r1 keeps `<think>` in it. The engine's text for a step does not say where each id's
text ends; vLLM's own incremental detokenizer, run on the same ids with the engine's settings,
does. Cut there, the pieces are the deltas an unmerged stream would have had.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.v1.engine.detokenizer import IncrementalDetokenizer

Piece = tuple[str, list[int]]  # (text, token ids) for one parse_delta call


class TokenTextEnds:
    """One choice's output decoded id by id, as the engine's detokenizer decodes it."""

    __slots__ = ("_decoder",)

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], sp: SamplingParams):
        # Same decoding as the engine's detokenizer for this request, minus the stop strings
        # (they would truncate its text, and the lengths are all it is asked for).
        params = SimpleNamespace(
            stop=None,
            min_tokens=sp.min_tokens,
            include_stop_str_in_output=sp.include_stop_str_in_output,
            skip_special_tokens=sp.skip_special_tokens,
            spaces_between_special_tokens=sp.spaces_between_special_tokens,
        )
        request = SimpleNamespace(
            request_id="token-text-ends", prompt_token_ids=prompt_token_ids, prompt_embeds=None, sampling_params=params
        )
        self._decoder = IncrementalDetokenizer.from_new_request(tokenizer, request)

    def end_of(self, token_id: int) -> int:
        """Decodes the next id: where its text ends, in output characters."""
        decoder = self._decoder
        decoder.update([token_id], False)
        return len(decoder.output_text)


def per_token(text: str, token_ids: list[int], ends: list[int], base: int) -> list[Piece]:
    """`text` (starting at output character `base`) cut at each id's end: one piece per id whose
    text it holds to the end. Ids past the end of `text` (a stop string cut it) go, with what is
    left of it, in one last piece, as they came; text past the last id's end stays with that id."""
    pieces: list[Piece] = []
    start, limit = 0, len(text)
    for k, end in enumerate(ends):
        cut = end - base
        if cut > limit:
            pieces.append((text[start:], token_ids[k:]))
            return pieces
        pieces.append((text[start:cut], token_ids[k : k + 1]))
        start = cut
    if start < limit:
        if pieces:
            last_text, last_ids = pieces[-1]
            pieces[-1] = (last_text + text[start:], last_ids)
        else:
            pieces.append((text, []))
    return pieces


class MergedSteps:
    """One choice whose engine text is not held back: a step with several ids cut into per-id
    pieces. Nothing is decoded until a step carries several ids (an unmerged stream never
    does); the decoder then catches up on the ids before it, once, and follows every id after."""

    __slots__ = ("_tokenizer", "_prompt_token_ids", "_sp", "_before", "_ends", "_end")

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], sp: SamplingParams):
        self._tokenizer, self._prompt_token_ids, self._sp = tokenizer, prompt_token_ids, sp
        self._before: list[int] = []  # the ids seen while nothing was decoded
        self._ends: TokenTextEnds | None = None
        self._end = 0  # where the decoded output ends

    def pieces(self, text: str, token_ids: list[int]) -> list[Piece] | None:
        """The step's per-id pieces, or None where it is one piece as it came (at most one id)."""
        ends = self._ends
        if ends is None:
            if len(token_ids) < 2:
                self._before += token_ids
                return None
            ends = self._ends = TokenTextEnds(self._tokenizer, self._prompt_token_ids, self._sp)
            for token_id in self._before:
                self._end = ends.end_of(token_id)
            self._before = []
        base = self._end
        token_ends = [ends.end_of(token_id) for token_id in token_ids]
        if not token_ends:
            return None
        self._end = token_ends[-1]
        return per_token(text, token_ids, token_ends, base) if len(token_ids) > 1 else None
