"""tests/images: the closures' pip work (tests/images/closures.py) starts once a run, early: under xdist, pytest's
main process starts it and publishes the results (tests/conftest.py); in one process, it starts when collection ends,
where tests/images/test_closures.py is among the tests to run, so that its waits on the package index overlap the
tests that run first."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from closures import PUBLISHED, Closures, Published

_started: list[Closures] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get(PUBLISHED) or _started:  # the main process works for every worker
        return
    if any(item.nodeid.startswith("tests/images/test_closures.py") for item in session.items):
        _started.append(Closures())


def pytest_sessionfinish(session: pytest.Session) -> None:
    while _started:
        _started.pop().close()


@pytest.fixture(scope="session")
def closures() -> Iterator[Closures | Published]:
    """The pip work's results: the main process's, or this process's (started here where collection did not, as
    when the node id differs)."""
    published = os.environ.get(PUBLISHED)
    if published:
        yield Published(Path(published))
        return
    if not _started:
        _started.append(Closures())
    yield _started[0]
