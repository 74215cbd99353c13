"""How the tests share the machine when pytest-xdist runs them in several workers (``make test``: ``-n 2``).

Most tests wait far more than they compute (on the API server, an operator, a child's output): two of them side by
side use the two cores that one alone leaves half idle. Some cannot share: the ``alone`` ones, which keep both cores
busy with their own stage processes (``pipefill local``, the benchmarks' runs) or time what a quiet core does. A
readers-writer lock on a file of this run decides: a test marked ``alone`` holds it exclusively, every other test
holds it shared. A test waiting to run alone closes a turnstile first, so that the other worker's next tests wait
behind it rather than keep it out. Without xdist (one process), there is nothing to share and no lock is taken.

The files run in this order (:func:`files_in_run_order`, from ``pytest_collection_modifyitems``; ``make test`` passes
``--no-loadscope-reorder``, without which xdist hands files out by their number of tests): the files that hold an
``alone`` test first, so that their ``alone`` tests mostly follow one another, each waiting for the other worker's
``alone`` test, not for a shared one to end (a whole run lost 225 s so, its alone tests spread among the shared
ones); then the files that hold a ``slow`` test, so that no long file is left to run by itself at the end while the
other worker idles (a run's last 27 s were one such file); then the rest, in their order.

A test that pins its processes to one core takes :func:`own_core`: each worker's core of its own, so that two workers'
pinned tests do not pile onto core 0 while core 1 idles.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = ["SHARING_DIR", "files_in_run_order", "own_core", "share_the_machine", "worker_index"]

SHARING_DIR = "PIPEFILL_TEST_SHARING_DIR"  # the lock's directory: made by pytest's main process, which starts workers


def worker_index() -> int | None:
    """This xdist worker's number (gw0 → 0), None when the tests run in one process."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def own_core() -> int:
    """The core this test's pinned processes use: one per worker (the worker's number among the allowed cores),
    the first allowed core without workers."""
    cores, index = sorted(os.sched_getaffinity(0)), worker_index()
    return cores[(index or 0) % len(cores)]


class _Item(Protocol):
    nodeid: str

    def get_closest_marker(self, name: str) -> Any: ...


def files_in_run_order(items: Sequence[_Item]) -> list[_Item]:
    """``items`` with the files that hold an ``alone`` test first, then those that hold a ``slow`` one, each file
    whole and the order otherwise kept (the same in every worker: xdist requires it)."""

    def files(marker: str) -> set[str]:
        return {item.nodeid.split("::")[0] for item in items if item.get_closest_marker(marker) is not None}

    alone, slow = files("alone"), files("slow")

    def rank(item: _Item) -> int:
        path = item.nodeid.split("::")[0]
        return 0 if path in alone else 1 if path in slow else 2

    return sorted(items, key=rank)


@contextlib.contextmanager
def share_the_machine(alone: bool) -> Iterator[None]:
    """Held around one test: exclusively for an ``alone`` test, shared for any other (under xdist only)."""
    where = os.environ.get(SHARING_DIR)
    if worker_index() is None or not where:
        yield
        return
    with open(Path(where) / "turnstile", "a") as turnstile, open(Path(where) / "lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
