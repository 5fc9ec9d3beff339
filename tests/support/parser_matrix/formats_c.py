"""Output formats of names only vLLM 0.33 registers (muse/musespark1x), merged into formats.FORMATS.

Read from 0.33's vllm/tool_parsers/muse_tool_parser.py and vllm/reasoning/muse_reasoning_parser.py.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.parser_matrix.formats import Format

# Muse (Muse Spark): every assistant message is `to=RECIPIENT<|message|>body<|eom|>`; the prompt ends
# with `<|start|>assistant` (tests/support/family_tokenizers.py's muse template), so the first message
# of the turn starts with ` to=` and every later one with `<|start|>assistant to=`. A piece here ends
# with the next message's `<|start|>assistant` wherever another message follows it.
_NEXT = "<|start|>assistant"


def _muse_message(recipient: str, body: str, end: str = "<|eom|>") -> str:
    return f" to={recipient}<|message|>{body}{end}"


def _muse_value(v: Any) -> str:
    # Strings as written (vLLM keeps a string-typed parameter raw), other values as JSON.
    return v if isinstance(v, str) else json.dumps(v)


def _muse_call(n: str, a: dict[str, Any]) -> str:
    # One tool-channel message per call. A bare tool name comes back doubled (`get_weather.get_weather`):
    # the recipient Muse's template offers for it, which vLLM's parser folds back to the registered name.
    name = f"{n}.{n}"
    params = "".join(f'<atem:parameter name="{k}">{_muse_value(v)}</atem:parameter>\n' for k, v in a.items())
    body = f'<atem:function_calls>\n<atem:invoke name="{name}">\n{params}</atem:invoke>\n</atem:function_calls>'
    return _muse_message(name, body)


FORMATS_C: dict[str, Format] = {
    "muse": Format(
        lambda text: _muse_message("self", text) + _NEXT,  # reasoning: the `to=self` channel
        lambda calls: _NEXT.join(_muse_call(n, a) for n, a in calls),
        content=lambda text: _muse_message("user", text, "<|eot|>"),  # the final answer ends the turn
        preamble=lambda text: _muse_message("commentary", text) + _NEXT,  # a user-visible update
        after_calls=lambda text: "",  # a call's <|eom|> hands the turn to the tool
        cut_at=38,  # inside the city argument
    ),
}
