"""The benchmark's requests: one chat prompt, realistic token scripts, and the request bodies per system.

Outputs are forced by the replay logits processor (`bench.systems.REPLAY`), so every
system streams exactly the same tokens. A script is a Qwen3-style answer built
from the demo tokenizer:

- "content": `<think>\\n` reasoning `\\n</think>\\n\\n` content;
- "tool": `<think>\\n` reasoning `\\n</think>\\n\\n<tool_call>\\n{"name": "write_file",
  "arguments": {"path": ..., "content": "..."}}\\n</tool_call>` (a hermes tool call with long arguments).

A script of a response length L has L-1 tokens; the replay processor then forces
EOS (<|im_end|>), so every response is exactly L output tokens, finish_reason
"stop" (or "tool_calls" at the derender/chat levels). Below TOOL_MIN_LENGTH a
tool call does not fit: both kinds are then the "content" script.

Prompts: the rendered chat prompt (262 tokens, the same for every request), or
for a scenario with `prompt_len` N > 0 an N-token filler prompt that is unique per
(N, repetition, request) and the same for every system (`Workload.prompt`): its
first tokens are the digits of N, the repetition and the request's sequence
number, so vLLM's prefix cache (on by default) never shares a block between two
requests, and every system prefills the same token ids.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.loadgen import Stream
from bench.scenarios import Scenario

MODEL = "demo"
GENERATE_PATH = "/inference/v1/generate"
CHAT_PATH = "/v1/chat/completions"
KINDS = ("content", "tool")
TOOL_MIN_LENGTH = 64
WARM_REP = 9999  # the "repetition" of warm-up requests' unique prompts (never a measured one)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a text file in the user's workspace",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
]
MESSAGES = [
    {"role": "system", "content": "You are a careful assistant. Think before answering; use tools when they help."},
    {
        "role": "user",
        "content": "Summarise what you know about running a small language model server on a CPU, "
        "and save the notes to a file if that is useful.",
    },
]

# ASCII only, no quotes or backslashes: any token prefix is valid text inside a JSON string.
_REASONING = (
    "The user wants a summary of running a small model server on a CPU. I should recall how the engine "
    "schedules decode steps, how the key value cache is sized in host memory, and how thread binding "
    "interacts with the web frontend that parses requests and streams tokens. Each step produces one token "
    "per running sequence, so the frontend has to keep up with the engine at every batch size. "
)
_CONTENT = (
    "Running a small model on a CPU is mostly a question of overheads: the model itself is cheap, so the "
    "scheduler, the detokenizer, the output parsers and the HTTP layer decide how many tokens per second "
    "reach the clients. Keep the frontend lean, pin the engine threads sensibly, and measure the processor "
    "time each layer spends per output token. "
)


def chat_request() -> dict[str, Any]:
    """The chat request every prompt is rendered from (and vLLM's /render is checked against)."""
    return {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto"}


def parse_context() -> dict[str, Any]:
    return {"tools": TOOLS, "tool_choice": "auto"}


def render_prompt(tokenizer: Any) -> list[int]:
    """The prompt token ids, rendered with the demo tokenizer's (Qwen3-style) chat template."""
    text = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _fill(tokenizer: Any, paragraph: str, n: int) -> list[int]:
    if n <= 0:
        return []
    ids = tokenizer.encode(paragraph, add_special_tokens=False)
    reps = n // len(ids) + 1
    return (ids * reps)[:n]


def make_script(tokenizer: Any, kind: str, length: int) -> list[int]:
    """L-1 token ids (the replay processor adds EOS as token L)."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    if kind == "tool" and length < TOOL_MIN_LENGTH:
        kind = "content"
    budget = length - 1
    head = enc("<think>\n")
    mid = enc("\n</think>\n\n")
    if kind == "content":
        fixed = len(head) + len(mid)
        reasoning = (budget - fixed) // 2
        script = head + _fill(tokenizer, _REASONING, reasoning) + mid + _fill(tokenizer, _CONTENT, budget - fixed - reasoning)
    elif kind == "tool":
        call_head = enc('<tool_call>\n{"name": "write_file", "arguments": {"path": "notes.md", "content": "')
        call_tail = enc('"}}\n</tool_call>')
        fixed = len(head) + len(mid) + len(call_head) + len(call_tail)
        reasoning = (budget - fixed) // 4
        args = budget - fixed - reasoning
        script = head + _fill(tokenizer, _REASONING, reasoning) + mid + call_head + _fill(tokenizer, _CONTENT, args) + call_tail
    else:
        raise ValueError(kind)
    if len(script) != budget:
        raise ValueError(f"script for {kind}/{length} has {len(script)} tokens, want {budget} (length too small?)")
    return script


def make_filler(tokenizer: Any) -> list[int]:
    """The body of a unique prompt (repeated to length): the reasoning and content paragraphs."""
    return tokenizer.encode(_REASONING + _CONTENT, add_special_tokens=False)


def make_digits(tokenizer: Any) -> list[int]:
    """The token id of each digit 0-9 (one token each in the Qwen tokenizer)."""
    ids = [tokenizer.encode(str(d), add_special_tokens=False) for d in range(10)]
    if any(len(x) != 1 for x in ids):
        raise ValueError(f"digits are not single tokens: {ids}")
    return [x[0] for x in ids]


def unique_prompt(filler: list[int], digits: list[int], n: int, rep: int | None, seq: int) -> list[int]:
    """N token ids: the digits of N, the repetition and the sequence number, then the filler."""
    salt = 0 if rep is None else rep + 1
    head = [digits[int(ch)] for ch in f"{n:05d}{salt:05d}{seq:06d}"]
    if n <= len(head):
        raise ValueError(f"prompt_len {n} too short for a unique prompt")
    body = n - len(head)
    return head + (filler * (body // len(filler) + 1))[:body]


@dataclass
class Workload:
    prompt_ids: list[int]
    scripts: dict[int, dict[str, list[int]]]  # length -> kind -> token ids
    filler_ids: list[int] = field(default_factory=list)  # unique prompts (prompt_len > 0)
    digit_ids: list[int] = field(default_factory=list)
    warm_length: int = 0  # warm-up requests' length (one of the scripts)

    @classmethod
    def build(cls, tokenizer: Any, lengths: list[int], warm_length: int) -> Workload:
        return cls(
            prompt_ids=render_prompt(tokenizer),
            scripts={L: {k: make_script(tokenizer, k, L) for k in KINDS} for L in sorted({*lengths, warm_length})},
            filler_ids=make_filler(tokenizer),
            digit_ids=make_digits(tokenizer),
            warm_length=warm_length,
        )

    def script(self, length: int, seq: int) -> list[int]:
        """Requests alternate between the two answer kinds."""
        return self.scripts[length][KINDS[seq % len(KINDS)]]

    def prompt(self, prompt_len: int = 0, rep: int | None = None, seq: int = 0) -> list[int]:
        """The prompt of request `seq`: the chat prompt (prompt_len 0) or a unique filler prompt."""
        if not prompt_len:
            return self.prompt_ids
        return unique_prompt(self.filler_ids, self.digit_ids, prompt_len, rep, seq)

    # --------------------------------------------------------------- bodies

    def generate_body(self, level: str, length: int, seq: int, prompt: list[int], stream: bool) -> dict[str, Any]:
        """A /inference/v1/generate request; level: tokens | text | derender."""
        sp: dict[str, Any] = {
            "max_tokens": length + 16,
            "skip_special_tokens": False,  # what /render sends for a chat with tools and a reasoning parser
            "extra_args": {"replay_token_ids": self.script(length, seq)},
        }
        body: dict[str, Any] = {
            "model": MODEL,
            "token_ids": prompt,
            "stream": stream,
            "output_mode": level,
            "sampling_params": sp,
        }
        if level == "derender":
            body["parse_context"] = parse_context()
        return body

    def chat_body(self, length: int, seq: int) -> dict[str, Any]:
        """vLLM's coupled streaming chat completion on the same script (token ids returned per chunk)."""
        return {
            **chat_request(),
            "stream": True,
            "max_completion_tokens": length + 16,
            "return_token_ids": True,
            "vllm_xargs": {"replay_token_ids": self.script(length, seq)},
        }

    def stream(self, level: str, length: int, seq: int, batch: bool = False, prompt_len: int = 0, rep: int | None = None) -> Stream:
        """The Stream for one request of a scenario level (`batch`: stream false, generate levels only;
        `prompt_len` > 0: a unique prompt of that many tokens for (rep, seq), generate levels only)."""
        if level == "chat":
            if batch or prompt_len:
                raise ValueError("the chat level has no batch or prompt_len form")
            return Stream(CHAT_PATH, self.chat_body(length, seq))
        if level not in ("tokens", "text", "derender"):
            raise ValueError(level)
        body = self.generate_body(level, length, seq, self.prompt(prompt_len, rep, seq), stream=not batch)
        return Stream(GENERATE_PATH, body, kind="batch" if batch else "sse")

    def requests_of(self, sc: Scenario) -> Callable[[int], Stream]:
        """Request `seq` of a scenario's run, for the load generator (the floor sends the same prompts)."""
        return lambda seq: self.stream(sc.level, sc.length, seq, sc.batch, sc.prompt_len, sc.rep)

    def to_json(self) -> str:
        return json.dumps({
            "prompt_ids": self.prompt_ids,
            "scripts": {str(k): v for k, v in self.scripts.items()},
            "filler_ids": self.filler_ids,
            "digit_ids": self.digit_ids,
            "warm_length": self.warm_length,
        })  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> Workload:
        d = json.loads(text)
        return cls(
            prompt_ids=d["prompt_ids"],
            scripts={int(k): v for k, v in d["scripts"].items()},
            filler_ids=d["filler_ids"],
            digit_ids=d["digit_ids"],
            warm_length=d["warm_length"],
        )
