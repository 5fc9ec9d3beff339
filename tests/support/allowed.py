"""The differences from vLLM's own generate server that ours keeps on purpose, one list per vLLM line:
each `Entry.id` is a heading of (or linked from) docs/vllm-differences.md's section for that line, and
a divergence the running line's list does not match fails tests/app/vllm/test_differential.py. An
entry is in a list only while a request needs it (that module checks)."""

from __future__ import annotations

from decode_server.compat import VLLM_LINE
from tests.support.differential import MISSING, Divergence, Entry, Result, compare, status
from tests.support.differential_facts import facts
from tests.support.differential_corpus import Case

# vLLM 0.32. Deliberate: ours is better here, and docs/vllm-differences.md says why (same ids).
ALLOWED_032: list[Entry] = [
    Entry("derender-level", "output_mode='derender' is served (vLLM 0.32 has only tokens and text)",
          lambda c, f, d, a, b: "derender" in f and (status(200, 400)(d) or (d.where == "error.type" and b.status == 400
          and "literal_error" in b.message))),
    Entry("chat-request-outside-derender", "chat_request at the tokens/text level is a 400, not silently ignored",
          lambda c, f, d, a, b: "chat-request" in f and "derender" not in f and status(400, 200)(d)),
    Entry("multimodal-fail-loud", "features/content_parts are a 400 'multimodal input is not supported'",
          lambda c, f, d, a, b: "multimodal" in f and ((d.where == "status" and d.ours == 400 and d.theirs in (200, 500))
          or (d.where == "error.type" and a.status == b.status == 400))),
    Entry("any-content-type", "a JSON body is accepted whatever its Content-Type says",
          lambda c, f, d, a, b: "content-type-not-json" in f and d.where == "status" and d.ours in (200, 400)
          and d.theirs == 400 and "Unsupported Media Type" in b.message),
    Entry("x-request-id-echo", "every generate response carries X-Request-Id (vLLM needs --enable-request-id-headers)",
          lambda c, f, d, a, b: d.where == "header:x-request-id" and d.theirs == MISSING and bool(d.ours)),
    Entry("bounded-request-ids", "a request id over 256 characters or with non-printable characters is a 400",
          lambda c, f, d, a, b: d.where == "status" and d.ours == 400 and d.theirs == 200
          and "printable ASCII" in a.message),
    Entry("minimal-body", "a body without sampling_params is served with the defaults (vLLM: 400)",
          lambda c, f, d, a, b: "no-sampling-params" in f and status(200, 400)(d)),
    Entry("strict-booleans-and-ids", "booleans as token ids and 'yes'/'no' for booleans are a 400 (vLLM coerces them)",
          lambda c, f, d, a, b: "lax-coercion" in f and status(400, 200)(d) and "got `" in a.message),
    Entry("first-of-several-errors", "a body with several errors: both 400, each server names a different one first",
          lambda c, f, d, a, b: d.where == "error.type" and a.status == b.status == 400 and c.id.startswith("gen_")),
]

# Known divergences the server will lose, on either line (project issue #12). NOT deliberate: delete each entry
# when its fix lands. A case whose divergences all match here xfails (strict=False).
PENDING_FIXES: list[Entry] = []

# vLLM 0.33: the 0.32 list's entries that the 0.33 comparison still needs, and 0.33's own.
STILL = ("chat-request-outside-derender", "multimodal-fail-loud", "any-content-type", "x-request-id-echo",
         "bounded-request-ids", "minimal-body", "strict-booleans-and-ids")
ALLOWED_033: list[Entry] = [e for e in ALLOWED_032 if e.id in STILL] + [
    Entry("derender-stream", "a derender stream is served (vLLM 0.33: 400 'does not support stream=true')",
          lambda c, f, d, a, b: "derender" in f and c.body.get("stream") is True and d.where == "status"
          and d.ours == 200 and d.theirs == 400 and "does not support stream=true" in b.message),
    Entry("stream-refused-before-first-chunk",
          "a stream the engine ends before its first chunk is answered with the error's status and body "
          "(vLLM: 200, then that error as the only event)",
          lambda c, f, d, a, b: c.body.get("stream") is True and d.where == "status" and b.status == 200
          and a.status == d.ours >= 400 and a.error is not None and b.body == [{"error": a.error}, "[DONE]"]),
]

ON_LINE = {"0.32": ALLOWED_032, "0.33": ALLOWED_033}
# Entries whose requests another module sends (with the divergence asserted there).
EXERCISED_ELSEWHERE = {"0.32": {}, "0.33": {"stream-refused-before-first-chunk": "tests/vllm033/test_engine_errors.py"}}


def classified(case: Case, a: Result, b: Result, line: str = VLLM_LINE) -> list[tuple[Divergence, Entry | None]]:
    """Each divergence of the two answers, with the entry of `line`'s list (or PENDING_FIXES) that names it."""
    f = facts(case)
    # A stream's error event has no request_id on either server: the harness's one-id-per-stream
    # check reads that as two ids, the same on both sides, which is no divergence.
    ds = [d for d in compare(case, a, b) if not (d.where == "sse.request_id-varies" and d.ours == d.theirs)]
    return [(d, next((e for e in [*ON_LINE[line], *PENDING_FIXES] if e.match(case, f, d, a, b)), None)) for d in ds]
