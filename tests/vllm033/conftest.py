"""The vLLM 0.33 tier: runs only with 0.33's modules first on the path (`./dev test tests/vllm033`:
tests/tiers.py starts it so). Anything else is a clear error, never a silent skip."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import vllm

from decode_server.tools.demo_model import ensure_demo_model
from tests.support.servers import PARSER_FLAGS
from tests.support.pair import Pair, serving_pair

if not vllm.__version__.startswith("0.33."):
    raise RuntimeError(
        f"tests/vllm033 runs on vLLM 0.33's modules, but this is vLLM {vllm.__version__} from {vllm.__file__}; "
        "run it as a tier: ./dev test tests/vllm033 (tests/tiers.py puts the cached 0.33 wheel's modules first on PYTHONPATH)"
    )


@pytest.fixture(scope="session")
def demo_model() -> Path:
    # The cached demo model (built once per machine), not a fresh one per session: its tokenizer
    # conversion alone costs seconds, and this tier compares two servers over the same files.
    return ensure_demo_model()


@pytest.fixture(scope="session")
def pair(demo_model) -> Iterator[Pair]:
    """Ours and vLLM 0.33's server with the reasoning (qwen3) and tool (hermes) parsers."""
    yield from serving_pair(demo_model, *PARSER_FLAGS)
