"""Ours and vLLM's own API server over the same scripted engine outputs, each on a loopback socket
(tests/support/loopback.py), for the comparisons written against URLs (the differential corpus,
tokens, text, derender): vLLM's serving code is the oracle, the engine is not what they compare,
and both apps get the same RequestOutputs step for step (the chunking included)."""

import pytest

from tests.support import servers
from tests.support.loopback import loopback


@pytest.fixture(scope="package")
def server(demo_model):
    """Ours as a decode pool runs it (the parsers the derender cases need)."""
    with loopback(demo_model, *servers.PARSER_FLAGS) as srv:
        yield srv


@pytest.fixture(scope="package")
def vllm_server(demo_model):
    """vLLM's own API server (`vllm serve`) on the same flags: the parity oracle."""
    with loopback(demo_model, *servers.PARSER_FLAGS, vllms=True) as srv:
        yield srv
