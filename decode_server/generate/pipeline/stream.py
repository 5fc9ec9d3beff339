"""One stream's stages as plain calls: an engine output in, its framed events out.

tokens → logprobs → [derender] → stats → wire → frames, each a call on the step (no async
generator per stage: the consumer in generate/one_pass.py runs this for every live stream once
per engine step). `framed_outputs` runs the same over an async source of outputs (the fallback
to vLLM's `generate()`, and a P/D decode leg under its first-token deadline).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from vllm.outputs import RequestOutput

from decode_server.generate.pipeline.frames import frame
from decode_server.generate.pipeline.steps import Step
from decode_server.generate.pipeline.tokens import to_step
from decode_server.generate.pipeline.wire import StreamWire

StepStage = Callable[[Step], None]


class StreamPipeline:
    __slots__ = ("_keep_text_only", "_stages", "_wire")

    def __init__(self, keep_text_only: bool, stages: list[StepStage], wire: StreamWire):
        self._keep_text_only = keep_text_only
        self._stages = stages  # logprobs, [derender], stats: in that order
        self._wire = wire

    def frames(self, output: RequestOutput) -> bytes:
        """The events of one engine output, framed (b"" when it sends none: a hidden step)."""
        step = to_step(output, self._keep_text_only)
        for stage in self._stages:
            stage(step)
        chunks = self._wire.chunks(step)
        if len(chunks) == 1:
            return frame(chunks[0])
        return b"".join([frame(chunk) for chunk in chunks])

    @property
    def tokens(self) -> int:
        """The completion tokens of every output framed so far."""
        return self._wire.stats.completion_tokens

    def sent(self, tokens: int) -> None:
        """Events up to `tokens` completion tokens are handed to the response."""
        self._wire.stats.sent_tokens = tokens

    def tail(self) -> bytes:
        """What follows the last output (the usage chunk, if asked for)."""
        return b"".join([frame(chunk) for chunk in self._wire.tail()])


async def framed_outputs(pipeline: StreamPipeline, outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
    """One write per engine output that has events, then the tail's."""
    async for output in outputs:
        data = pipeline.frames(output)
        if data:
            pipeline.sent(pipeline.tokens)
            yield data
    tail = pipeline.tail()
    if tail:
        yield tail
