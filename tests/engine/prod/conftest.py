"""The production-like server (tests/support/prod_server.py) for this package's two modules: pytest
runs them in name order, so test_lora.py comes first and test_operations.py, whose last two tests
end the server (its drain, then its log read back), last."""

from pathlib import Path

import pytest

from tests.support import prod_server as prod
from tests.support import servers


@pytest.fixture(scope="package")
def lora_adapters(demo_model, tmp_path_factory) -> dict[str, Path]:
    """Two random-weight adapters for the demo model: one the prod server serves from its start, one
    loaded at runtime."""
    root = tmp_path_factory.mktemp("lora")
    return {name: prod.build_adapter(demo_model, root / name, seed) for name, seed in ((prod.ADAPTER, 1), ("second", 2))}


@pytest.fixture(scope="package")
def prod_server(demo_model, log_dir, lora_adapters):
    """Every frontend flag and LoRA on one real engine."""
    with servers.running(prod.server(demo_model, log_dir, lora_adapters[prod.ADAPTER])) as (server,):
        yield server
