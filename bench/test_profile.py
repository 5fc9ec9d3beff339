"""bench.profile's reading of py-spy's collapsed stacks, without an engine or py-spy."""

from __future__ import annotations

from pathlib import Path

from bench.profile import summarize

SEND = "send (uvicorn/protocols/http/httptools_impl.py:500)"
LOOP = "run (uvloop/__init__.py:60)"
PASS = "drain (decode_server/generate/one_pass.py:80)"
PROCESS = "process_outputs (vllm/v1/engine/output_processor.py:400)"


def test_a_sample_counts_in_every_part_its_stack_passes_and_self_time_goes_to_its_leaf(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "\n".join([
            f"{LOOP};{PASS};{PROCESS} 6",
            f"{LOOP};{PASS};{SEND} 3",
            f"{LOOP} 1",
            "not a stack line",
        ])  # fmt: skip
    )
    parts, top, samples = summarize(raw)
    share = {name: float(pct) for pct, name in parts}
    assert samples == 10
    assert share["ours: one-pass consumer and stages (decode_server/generate)"] == 90.0
    assert share["vLLM OutputProcessor.process_outputs (detokenizer, stop strings, collectors)"] == 60.0
    assert share["uvicorn: HTTP parsing and the socket write"] == 30.0
    assert share["event loop's own work (uvloop: epoll, callbacks; self time)"] == 10.0
    assert share["sse-starlette + anyio (the SSE response: task group, send)"] == 0.0
    assert top[0] == ["60.0", "`process_outputs (vllm/v1/engine/output_processor.py)`"]
    assert [row[0] for row in top] == ["60.0", "30.0", "10.0"]
