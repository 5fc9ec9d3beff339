"""Per-request stages over engine outputs: tokens → logprobs → [derender] → stats → wire.

Each stage is an async generator that takes the previous stage's `Step`s and
enriches their choices; the output mode's record decides which are stacked.
"""
