"""The differences from vLLM 0.33's own generate server that ours keeps on purpose: each `Entry.id`
is a heading of docs/vllm-differences.md's 0.33 section, and a divergence the list does not match
fails the 0.33 tier. An entry is here only while a request needs it (test_wire checks)."""

from __future__ import annotations

from tests.support.differential_corpus import Case
from tests.app.vllm.test_differential import ALLOWED, Divergence, Entry, Result, compare, facts

# The 0.32 list's entries that the 0.33 comparison still needs, and 0.33's own.
STILL = ("chat-request-outside-derender", "multimodal-fail-loud", "any-content-type", "x-request-id-echo",
         "bounded-request-ids", "minimal-body", "strict-booleans-and-ids")
ALLOWED_033: list[Entry] = [e for e in ALLOWED if e.id in STILL] + [
    Entry("derender-stream", "a derender stream is served (vLLM 0.33: 400 'does not support stream=true')",
          lambda c, f, d, a, b: "derender" in f and c.body.get("stream") is True and d.where == "status"
          and d.ours == 200 and d.theirs == 400 and "does not support stream=true" in b.message),
    Entry("stream-refused-before-first-chunk",
          "a stream the engine ends before its first chunk is answered with the error's status and body "
          "(vLLM: 200, then that error as the only event)",
          lambda c, f, d, a, b: c.body.get("stream") is True and d.where == "status" and b.status == 200
          and a.status == d.ours >= 400 and a.error is not None and b.body == [{"error": a.error}, "[DONE]"]),
]


def classified(case: Case, a: Result, b: Result) -> list[tuple[Divergence, Entry | None]]:
    f = facts(case)
    # A stream's error event has no request_id on either server: the harness's one-id-per-stream
    # check reads that as two ids, the same on both sides, which is no divergence.
    ds = [d for d in compare(case, a, b) if not (d.where == "sse.request_id-varies" and d.ours == d.theirs)]
    return [(d, next((e for e in ALLOWED_033 if e.match(case, f, d, a, b)), None)) for d in ds]
