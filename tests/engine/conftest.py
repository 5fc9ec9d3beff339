"""The servers two modules of this folder share (tests/support/parser_class_servers.py): ours with
the parser classes the matrix adds, on real engines, started together when the first of the two
asks (test_parser_matrix_real.py, by name), and each ended by its last test (the `hf` server by
test_scale_out.py's drain). The subpackages own their servers (decode/, prod/, pd/)."""

import pytest

from tests.support import servers


@pytest.fixture(scope="package")
def parser_class_servers(demo_model, log_dir):
    """Run name -> its server, all started at once: one wait, not three."""
    from tests.support import parser_class_servers as pcs

    runs = pcs.runs()
    with servers.running(*(pcs.server(run, demo_model, log_dir) for run in runs)) as started:
        yield {run.name: server for run, server in zip(runs, started)}
