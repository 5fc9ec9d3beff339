"""One P/D set for the package's modules (NIXL, three engines): test_pd.py and test_pd_behind_llm_d.py run first,
test_pd_faults.py after them (pytest runs a package's modules in name order), whose last tests kill
instances. Each module that needs them gets the set's prefill and recompute decode instances behind its
own pd-proxy (pd_pair)."""

import sys

import pytest

from tests.support import servers
from tests.support.pd_pair import running_set


@pytest.fixture(scope="package")
def pd_set(demo_model, log_dir, tmp_path_factory):
    yield from running_set(demo_model, log_dir, tmp_path_factory)


class Pair:
    def __init__(self, prefill: servers.Server, decode: servers.Server, proxy: servers.Server):
        self.prefill, self.decode, self.proxy = prefill, decode, proxy


@pytest.fixture(scope="module")
def pd_pair(pd_set, log_dir):
    """The shared set's prefill instance and its `recompute` decode instance (the parsers, a 30 s
    deadline; a failed pull is caught by the p2p counts asserted below), behind `pd-proxy`."""
    prefill, decode = pd_set.prefill, pd_set.recompute
    proxy = servers.Server(
        "pd-proxy",
        [sys.executable, "-m", "decode_server.tools.pd_proxy", "--prefill", prefill.url, "--decode", decode.url],
        log_dir,
        engine=False,
    ).start(timeout_s=60)
    try:
        yield Pair(prefill, decode, proxy)
    finally:
        proxy.stop()
