"""Ours as a decode pool runs it (tokenizer, qwen3 reasoning + hermes tool parsers) on a real engine,
one for this package's modules, stopped after the last of them."""

import pytest

from tests.support import servers


@pytest.fixture(scope="package")
def server(demo_model, log_dir):
    with servers.running(servers.ours("decode", demo_model, log_dir, *servers.PARSER_FLAGS)) as (started,):
        yield started
