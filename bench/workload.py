"""The benchmark's requests: one chat prompt, realistic token scripts, and the request bodies per system.

Outputs are forced by `decode_server.replay:ReplayLogitsProcessor`, so every
system streams exactly the same tokens. A script is a Qwen3-style answer built
from the demo tokenizer:

- "content": `<think>\\n` reasoning `\\n</think>\\n\\n` content;
- "tool": `<think>\\n` reasoning `\\n</think>\\n\\n<tool_call>\\n{"name": "write_file",
  "arguments": {"path": ..., "content": "..."}}\\n</tool_call>` (a hermes tool call with long arguments).

A script of a response length L has L-1 tokens; the replay processor then forces
EOS (<|im_end|>), so every response is exactly L output tokens, finish_reason
"stop" (or "tool_calls" at the derender/chat levels).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bench.loadgen import Stream

MODEL = "demo"
GENERATE_PATH = "/inference/v1/generate"
CHAT_PATH = "/v1/chat/completions"
KINDS = ("content", "tool")

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
    """The chat request every prompt is rendered from (also the RFC's chat_request)."""
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


@dataclass
class Workload:
    prompt_ids: list[int]
    scripts: dict[int, dict[str, list[int]]]  # length -> kind -> token ids

    @classmethod
    def build(cls, tokenizer: Any, lengths: list[int]) -> Workload:
        return cls(
            prompt_ids=render_prompt(tokenizer),
            scripts={L: {k: make_script(tokenizer, k, L) for k in KINDS} for L in sorted(set(lengths))},
        )

    def script(self, length: int, seq: int) -> list[int]:
        """Requests alternate between the two answer kinds."""
        return self.scripts[length][KINDS[seq % len(KINDS)]]

    # --------------------------------------------------------------- bodies

    def generate_body(self, level: str, length: int, seq: int, *, logprobs: int | None = None, stream: bool = True) -> dict[str, Any]:
        """A /inference/v1/generate request (streamed unless `stream` is false); level: tokens | text | derender."""
        sp: dict[str, Any] = {
            "max_tokens": length + 16,
            "skip_special_tokens": False,  # what /render sends for a chat with tools and a reasoning parser
            "extra_args": {"replay_token_ids": self.script(length, seq)},
        }
        if logprobs is not None:
            sp["logprobs"] = logprobs
        body: dict[str, Any] = {
            "model": MODEL,
            "token_ids": self.prompt_ids,
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

    def stream(
        self, scenario: str, length: int, seq: int, label: str | None = None, derender_url: str | None = None, batch: bool = False
    ) -> Stream:
        """The Stream for one request of a scenario level (`batch`: stream false, generate levels only)."""
        label = label or scenario
        if batch:
            if scenario not in ("tokens", "text", "derender"):
                raise ValueError(f"no batch form of {scenario!r}")
            return Stream(label, GENERATE_PATH, self.generate_body(scenario, length, seq, stream=False), kind="batch")
        if scenario in ("tokens", "text", "derender"):
            return Stream(label, GENERATE_PATH, self.generate_body(scenario, length, seq))
        if scenario == "text_lp20":
            return Stream(label, GENERATE_PATH, self.generate_body("text", length, seq, logprobs=20))
        if scenario == "chat":
            return Stream(label, CHAT_PATH, self.chat_body(length, seq))
        if scenario == "rfc":
            return Stream(
                label,
                GENERATE_PATH,
                self.generate_body("tokens", length, seq),
                kind="rfc",
                derender_url=derender_url,
                derender_ctx={
                    "model": MODEL,
                    "prompt_token_ids": self.prompt_ids,
                    "prompt_tokens": len(self.prompt_ids),
                    "chat_request": chat_request(),
                },
            )
        raise ValueError(scenario)

    def to_json(self) -> str:
        return json.dumps({"prompt_ids": self.prompt_ids, "scripts": {str(k): v for k, v in self.scripts.items()}})

    @classmethod
    def from_json(cls, text: str) -> Workload:
        d = json.loads(text)
        return cls(prompt_ids=d["prompt_ids"], scripts={int(k): v for k, v in d["scripts"].items()})
