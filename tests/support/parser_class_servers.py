"""Ours on a real engine with each parser class vLLM's ParserManager composes that the parser matrix
adds: `hf` (ResponseTemplateParser), gpt-oss (HarmonyParser) and kimi-k3 (KimiK3Parser), each on
its matrix row's model and flags. tests/engine/conftest.py starts them together for
tests/engine/test_parser_matrix_real.py (the classes' real-engine parity) and
tests/engine/test_scale_out.py (the `--api-server-count 2` tests): one engine start serves both the
`hf` parity and the scale-out tests.

Each server ends in a test (a server thrown away anyway, an engine start less each): gpt-oss by a
SIGKILL of the server, kimi-k3 (two API processes) by its engine core's death, both in
test_parser_matrix_real.py; `hf` (two API processes, a short drain window) by the scale-out drain,
the last test of test_scale_out.py, which runs after the parity by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support import servers

# The scale-out server: test_scale_out.py's tests and its drain (which cuts at this window).
SCALE_OUT = "hf"
DRAIN_S = 4
# The server whose end is the engine core's death with two API processes.
ENGINE_DEATH = "kimi-k3"
TWO_API_PROCESSES = ("--api-server-count", "2")
# tests/support/stream_reader.py's connection_to pins a request to one API process by keeping its
# connection open; uvicorn closes an idle one after VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default),
# and a loaded machine can spend that long finding the next connection: the request then reconnected
# to the other process (a clean-clone run: both drain shorts on process 1).
PINNED_CONNECTIONS_ENV = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "300"}


@dataclass
class Run:
    """One composed parser class on a real engine: ours with `flags` on `family`'s model."""

    name: str
    parser_class: str
    family: str | None  # a matrix family's model directory; None: the demo model
    flags: list[str]
    cases: list  # the row's chat cases (tests/support/parser_matrix/families.py's Case)


def runs() -> list[Run]:
    # Imported here: the matrix's families import vLLM (seconds), which only these servers' users need.
    from tests.support.parser_matrix import families as fm

    def row_cases(row: fm.Row) -> list[fm.Case]:
        # vLLM's render refuses these (asserted in the matrix): no request to compare.
        return [case for case in fm.cases(row) if case.name not in dict(row.refused_at_render)]

    hf = next(row for row in fm.ROWS if row.tool_parser == "hf")
    gpt_oss = next(row for row in fm.ROWS if row.family == "gpt_oss")
    # ParserManager composes KimiK3Parser for the kimi_k3 parser name on any model (not by model
    # type): the matrix's Kimi K3 row, on its family model.
    kimi_k3 = next(row for row in fm.ROWS if row.reasoning_parser == "kimi_k3")
    return [
        Run("hf", "ResponseTemplateParser", hf.family, hf.flags, row_cases(hf)),
        Run("gpt-oss", "HarmonyParser", gpt_oss.family, gpt_oss.flags, row_cases(gpt_oss)),
        Run("kimi-k3", "KimiK3Parser", kimi_k3.family, kimi_k3.flags, row_cases(kimi_k3)),
    ]


def model_dir(run: Run, demo_model: Path) -> Path:
    from tests.support.parser_matrix.models import family_model

    # Beside the session's demo model: built once, by the server's factory and then found by the test.
    return demo_model if run.family is None else family_model(run.family, demo_model.parent / "families", demo_model)


def server(run: Run, demo_model: Path, log_dir: Path) -> servers.Server:
    extra: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    if run.name == SCALE_OUT:
        extra, env = (*TWO_API_PROCESSES, "--shutdown-timeout", str(DRAIN_S)), PINNED_CONNECTIONS_ENV
    elif run.name == ENGINE_DEATH:
        extra, env = TWO_API_PROCESSES, PINNED_CONNECTIONS_ENV
    # The model is built before the server copies the environment: gpt-oss's sets TIKTOKEN_ENCODINGS_BASE.
    return servers.ours(f"decode-{run.name}", model_dir(run, demo_model), log_dir, *run.flags, *extra, env=env)
