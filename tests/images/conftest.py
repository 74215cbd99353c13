"""tests/images: the closures' pip work (tests/images/closures.py) starts when collection ends, where
tests/images/test_closures.py is among the tests to run, so that its waits on the package index overlap the tests
that run first."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from closures import Closures

_started: list[Closures] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(item.nodeid.startswith("tests/images/test_closures.py") for item in session.items) and not _started:
        _started.append(Closures())


def pytest_sessionfinish(session: pytest.Session) -> None:
    while _started:
        _started.pop().close()


@pytest.fixture(scope="session")
def closures() -> Iterator[Closures]:
    """The pip work started at collection (started here where collection did not, as when the node id differs)."""
    if not _started:
        _started.append(Closures())
    yield _started[0]
