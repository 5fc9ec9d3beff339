"""By-hand verdicts for the rows of tests/support/parser_matrix/formats_a.py's families and of the
parsers that read the demo's Qwen vocabulary (minicpmv), where vLLM's own stream and batch disagree
(merged into verdicts.BY_HAND)."""

from __future__ import annotations

_MINICPMV = "qwen3:qwen3_coder+minicpmv"
# Why vLLM's minicpmv stream reads no thought when the request has tools.
_TOOLS_IN_PROMPT = (
    "vLLM's minicpmv parser decides from the prompt that the thought has already ended whenever the request has "
    "tools: its grammar (Qwen3's, thinking on) names no turn boundary, so its backward scan of the prompt for a "
    "token that ends reasoning runs past `<|im_start|>assistant` into the system prompt and stops at the "
    "`<tool_call>` of the template's tool instructions; the stream then starts in content"
)
# The answer Qwen3's grammar gives, which vLLM's qwen3 row gives in its stream and batch alike.
_BY_THE_GRAMMAR = (
    "batch is right by the family's grammar (Qwen3's, thinking on: {reading}, as vLLM's qwen3 row answers in its "
    "stream and batch alike); " + _TOOLS_IN_PROMPT + ", so {stream}"
)
_MINIMAX_APPEND = "minimax_m2:minimax_m2+minimax_m2_append_think"
# Why vLLM's stream never parses a call that follows no `</think>` under minimax_m2_append_think.
_NO_THINK_END = (
    "batch is right about the call: the model wrote a complete call block; vLLM's stream hands the text to the "
    "minimax_m2 tool parser only once the thought has ended, which minimax_m2_append_think says only at a "
    "`</think>` token, and this output (no thought before the call) has none, so the stream sends the call's "
    "markup as content; the batch parser reads the call in the whole content{batch}"
)

BY_HAND_A: dict[tuple[str, str], str] = {
    **{
        (_MINICPMV, case): (
            f"batch is right: the model thought in `<think>`, then {called}; "
            + _TOOLS_IN_PROMPT
            + ", and sends the thought, `<think>` included, as content (dropping `</think>`)"
        )
        for case, called in (
            ("reasoning_then_two_calls", "called"),
            ("tool_choice_required", "wrote the calls vLLM's guided decoding forced"),
            ("tool_choice_named", "wrote the arguments vLLM's guided decoding forced"),
        )
    },
    (_MINICPMV, "content_around_calls"): _BY_THE_GRAMMAR.format(
        reading="text before a call with no `</think>` is the thought, which the call ends, and the text after the "
        "call is dropped",
        stream="the stream sends the text around the call as content",
    ),
    (_MINICPMV, "tool_choice_none"): _BY_THE_GRAMMAR.format(
        reading="output with no `</think>` is the thought",
        stream="the stream sends the text as content",
    ),
    (_MINICPMV, "stop_string_inside_markup"): (
        "neither is a call to run: the stop string cuts the call's arguments; the stream sent the call with partial "
        "arguments, the batch answer keeps it with `{}` arguments. A client must not run a call of a choice that "
        "finished with a stop string inside the call. The thought is the batch's: "
        + _TOOLS_IN_PROMPT
        + ", and sends the thought, `<think>` included, as content"
    ),
    ("gemma4:gemma4+gemma4", "content_around_calls"): (
        "stream is right, by a space: the model wrote `Let me check. ` and then the call (which ends its turn); "
        "vLLM's batch gemma4 parser strips the space before the call, the stream gives the text as written"
    ),
    ("minicpm5:minicpm5+-", "reasoning_then_two_calls"): (
        "batch is right: the stream also sends the newline between the two calls as content; it is the format's "
        "framing, not text the model addressed to the user"
    ),
    (_MINIMAX_APPEND, "reasoning_then_two_calls"): (
        "stream is right, by a newline: minimax_m2_append_think gives the thought back as content behind the "
        "`<think>` it adds, and both answers drop the `</think>` that closes it; the stream keeps the newline the "
        "model wrote before it, the batch strips it"
    ),
    ("minicpm5:minicpm5+-", "content_around_calls"): (
        "stream is right: the model wrote `Let me check.` before the call and ` Done.` after it; vLLM's batch "
        "minicpm5 parser returns no content at all once it parsed a call"
    ),
    (_MINIMAX_APPEND, "content_around_calls"): _NO_THINK_END.format(
        batch=" (it drops ` Done.` after the block, and the space before the block)"
    ),
    (_MINIMAX_APPEND, "tool_choice_required"): _NO_THINK_END.format(batch=""),
    (_MINIMAX_APPEND, "tool_choice_named"): _NO_THINK_END.format(batch=""),
}
