"""Ours as a decode pool runs it (tokenizer, qwen3 reasoning + hermes tool parsers) on a real engine,
one for this package's modules, stopped after the last of them; pytest runs them in name order, and
the last, test_the_end.py, kills its engine core (the server's end).

It runs in the test's session (not one of its own), as processes started from one shell or in one
container do: test_streams_under_load.py's CPU hogs then share its scheduling group. Its transport
bounds are shortened for test_faults_transport.py (what they are for: there); no other module comes near them.
"""

import pytest

from tests.support import servers

SLOTS = int(servers.ENGINE_FLAGS[servers.ENGINE_FLAGS.index("--max-num-seqs") + 1])
HEAD_TIMEOUT_S = 3
SEND_TIMEOUT_S = 3
KEEP_ALIVE_S = 60


@pytest.fixture(scope="package")
def server(demo_model, log_dir):
    env = {
        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(KEEP_ALIVE_S),
        "DECODE_SERVER_REQUEST_HEAD_TIMEOUT_S": str(HEAD_TIMEOUT_S),
        "DECODE_SERVER_STREAM_SEND_TIMEOUT_S": str(SEND_TIMEOUT_S),
    }
    decode = servers.ours("decode", demo_model, log_dir, *servers.PARSER_FLAGS, env=env)
    decode.own_session = False
    with servers.running(decode) as (started,):
        yield started


@pytest.fixture(scope="module")
def faults(server):
    """The package's server after one request has run (the fault tests time their bounds from a
    warm engine)."""
    from tests.engine.decode.faults import warm_up

    warm_up(server)
    return server
