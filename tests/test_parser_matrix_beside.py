"""The in-process parser matrix (tests/test_parser_matrix.py) in a session of its own beside the suite
(tests/beside.py): about two minutes of one core that shares nothing with the other in-process
tests, so that it runs on the second core while they and the real-engine tests go on.

When a session selects this test and the matrix's, conftest moves the matrix's out of the main
session (`MOVES_BESIDE`) into this one's, which fails with that session's output. Selected without
this test (`pytest tests/test_parser_matrix.py`, `-k`), the matrix runs in the main session."""

from __future__ import annotations

import pytest

from tests import beside

MOVES_BESIDE = "tests/test_parser_matrix.py"
MATRIX = beside.Session(f"{MOVES_BESIDE} beside the suite", beside.inherited_env)


def _tests(config: pytest.Config) -> list[str]:
    """The matrix's tests conftest moved here, or all of them (this test selected alone)."""
    return config.stash.get(beside.MOVED, {}).get(MOVES_BESIDE) or [MOVES_BESIDE]


def start_beside_the_suite(items: list[pytest.Item]) -> None:
    """Called by conftest at collection: the matrix's session is queued now."""
    MATRIX.start(_tests(items[0].config))


def test_the_parser_matrix_passes_in_a_session_of_its_own(request):
    failure = MATRIX.start(_tests(request.config)).failure()
    if failure:
        pytest.fail(failure, pytrace=False)
