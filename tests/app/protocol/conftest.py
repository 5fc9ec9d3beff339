"""The scripted upstream, one per module, unscripted again around each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.scripted_upstream import Upstream


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream().start()
    yield server
    server.stop()


@pytest.fixture
def srv(upstream: Upstream) -> Iterator[Upstream]:
    upstream.script(Upstream._not_scripted)
    yield upstream
    upstream.script(Upstream._not_scripted)
