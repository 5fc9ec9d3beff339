"""One P/D set for both modules (NIXL, three engines): test_pd.py runs first, test_pd_faults.py after
it (pytest runs a package's modules in name order), whose last tests kill instances."""

import pytest

from tests.support.pd_pair import running_set


@pytest.fixture(scope="package")
def pd_set(demo_model, log_dir, tmp_path_factory):
    yield from running_set(demo_model, log_dir, tmp_path_factory)
