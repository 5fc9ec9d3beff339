"""Per-request stages over engine outputs: tokens → logprobs → [derender] → stats → wire.

Each stage is a plain call on one engine step's `Step` that enriches its choices
(stream.py runs a stream's stages per engine output); the output mode's record decides
which are stacked. A batch request, one engine output, runs them over an async source.
"""
