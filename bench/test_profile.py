"""bench.profile's reading of py-spy's collapsed stacks, without an engine or py-spy."""

from __future__ import annotations

from pathlib import Path

from bench.profile import summarize

LOOP = "Runner.run (asyncio/runners.py:118)"
HANDLER = "AsyncLLM._run_output_handler.<locals>.output_handler (vllm/v1/engine/async_llm.py:600)"
PROCESS = "OutputProcessor.process_outputs (vllm/v1/engine/output_processor.py:400)"
PASS = "StepConsumer._pass (decode_server/generate/one_pass.py:60)"
FRAMES = "StreamPipeline.frames (decode_server/generate/pipeline/stream.py:33)"
SEND = "RequestResponseCycle.send (uvicorn/protocols/http/httptools_impl.py:500)"


def test_self_time_goes_to_the_leafs_part_and_a_stage_counts_every_sample_under_it(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "\n".join([
            f"{LOOP};{HANDLER};{PROCESS} 5",
            f"{LOOP};{PASS};{FRAMES} 2",
            f"_framed (decode_server/http/sse.py:40);{SEND} 2",
            f"{LOOP} 1",
            "not a stack line",
        ])  # fmt: skip
    )
    selves, under, top, samples = summarize(raw)
    self_share = {name: float(pct) for pct, name in selves}
    under_share = {name: float(pct) for pct, name in under}
    assert samples == 10
    assert self_share["vLLM's engine client (output processor, detokenizer, collectors)"] == 50.0
    assert self_share["ours: generate (one-pass consumer, stages, framing)"] == 20.0
    assert self_share["uvicorn: the socket write (`RequestResponseCycle.send`)"] == 20.0
    assert self_share["the event loop's own work (epoll, callbacks)"] == 10.0
    assert sum(self_share.values()) == 100.0  # each sample's self time is in exactly one part
    assert under_share["vLLM's output handler (process_outputs, stat loggers, collector puts)"] == 50.0
    assert under_share["ours: the one-pass consumer's passes (stages, framing, buffers)"] == 20.0
    assert top[0] == ["50.0", "`OutputProcessor.process_outputs (vllm/v1/engine/output_processor.py)`"]
