"""Per-request stages over engine outputs: tokens → text → derender.

Each stage is an async generator that takes the previous stage's `Step`s and
enriches their choices; the output mode decides how many are stacked.
"""
