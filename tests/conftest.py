"""What every tier shares: the demo model, its tokenizer, a folder for server logs, and the app over
the scripted engine. Each tier is its own pytest process (`./dev test`, tests/tiers.py); servers
with real engines belong to the module or package whose tests use them (tests/engine/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from decode_server.compat import VLLM_LINE
from decode_server.tools.demo_model import build_demo_model
from tests.support import servers

# tests/vllm033 runs on vLLM 0.33's modules, a tier of its own (tests/tiers.py puts them first on the
# path); on 0.32 a run that names `tests` does not collect it.
collect_ignore = [] if VLLM_LINE == "0.33" else ["vllm033"]


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("model") / "demo")


@pytest.fixture(scope="session")
def tokenizer(demo_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model)


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture
def anyio_backend():
    """Async tests (`pytest.mark.anyio`) run on asyncio, the loop the server and vLLM use."""
    return "asyncio"


@pytest.fixture
async def inproc(demo_model):
    """The app over the scripted engine, as the decode pool runs it (the real decode server's flags)."""
    from tests.support.inprocess import serve

    async with serve(demo_model, *servers.PARSER_FLAGS) as app:
        yield app
