"""How the tests share the machine when pytest-xdist runs them in several workers (``make test``: ``-n 2``).

Most tests wait far more than they compute (on the API server, an operator, a child's output): two of them side by
side use the two cores that one alone leaves half idle. Some cannot share: the ``alone`` ones, which time what a quiet
core does or keep both cores busy from start to end (the benchmarks' timed runs). Between the two are the ``busy``
ones: heavy (``pipefill local``, a control plane at scale, a real node) but untimed, and often one core idle in their
start-up and end (a run measured 300 of its 410 idle core-seconds in them, docs/benchmarks.md); a ``busy`` test runs
beside a shared one, never beside another ``busy`` or ``alone`` one. Locks on files of this run decide: a
readers-writer lock that an ``alone`` test holds exclusively and every other test shared, and a second lock that a
``busy`` test holds exclusively. A test waiting to run alone closes a turnstile first, so that the other worker's next
tests wait behind it rather than keep it out. Without xdist (one process), there is nothing to share and no lock is
taken.

The files run in this order (:func:`files_in_run_order`, from ``pytest_collection_modifyitems``; ``make test`` passes
``--no-loadscope-reorder``, without which xdist hands files out by their number of tests): the files that hold an
``alone`` test first, so that their ``alone`` tests mostly follow one another, each waiting for the other worker's
``alone`` test, not for a shared one to end (a whole run lost 225 s so, its alone tests spread among the shared
ones); then the files that hold a ``busy`` test, longest first, each followed by files of shared tests that last
about as long, so that while one worker is in a ``busy`` file the other runs shared ones beside it and seldom reaches
the next ``busy`` file before it ends (two ``busy`` files at once take turns, test by test: with shares counted in
files, not seconds, a run left one worker 84 s waiting for the other's); then the rest, the shortest last, so that
no long file is left to run by itself at the end while the other worker idles (a run's last 27 s were one such
file). A file's seconds are those of an earlier whole run, in tests/durations.json: ``PIPEFILL_TEST_DURATIONS=FILE``
writes the table of a run (tests/conftest.py); a new file counts as short or, with a ``slow`` test, as long.

A test that pins its processes to one core takes :func:`own_core`: each worker's core of its own, so that two workers'
pinned tests do not pile onto core 0 while core 1 idles.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "DURATIONS", "KINDS", "SHARING_DIR", "durations", "files_in_run_order", "kind_of", "own_core", "share_the_machine",
    "worker_index",
]  # fmt: skip

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


def _path(item: _Item) -> str:
    return item.nodeid.split("::")[0]


DURATIONS = Path(__file__).with_name("durations.json")  # each file's seconds in a whole run: conftest.py writes it


def durations() -> dict[str, float]:
    """Each test file's seconds in an earlier whole run (tests/durations.json), by path from the repository root."""
    try:
        table: dict[str, float] = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return table


def files_in_run_order(items: Sequence[_Item], seconds: Mapping[str, float] | None = None) -> list[_Item]:
    """``items`` with the files that hold an ``alone`` test first; then each file that holds a ``busy`` one, longest
    first, each followed by the shortest of the others (taken along by its worker), then a share of the others
    (longest first, at least one) that lasts about as long as it does,
    times the others' total over the busy files' total plus one busy file's mean, so that a share is left for the end
    (the shortest files); each file whole and the order otherwise kept (the same in every worker: xdist requires it).
    ``seconds``: each file's duration (default: tests/durations.json); a file not there counts 20 s where it holds a
    ``slow`` test, else 2 s."""

    def files(marker: str) -> set[str]:
        return {_path(item) for item in items if item.get_closest_marker(marker) is not None}

    alone, slow = files("alone"), files("slow")
    table = durations() if seconds is None else seconds

    def length(path: str) -> float:
        return table.get(path, 20.0 if path in slow else 2.0)

    busy = files("busy") - alone
    paths = list(dict.fromkeys(_path(item) for item in items))
    heavy = sorted((p for p in paths if p in busy), key=lambda p: -length(p))
    others = sorted((p for p in paths if p not in alone and p not in busy), key=lambda p: -length(p))
    order = [p for p in paths if p in alone]
    busy_s = sum(length(p) for p in heavy)
    ratio = sum(length(p) for p in others) / (busy_s + busy_s / len(heavy)) if heavy else 0.0
    taken = due = 0.0  # the others' seconds placed so far, and due so far (a share that ran over, the next makes up)
    for path in heavy:
        # xdist gives a worker its next file once 2 of its tests are left: a busy file of 2 takes the next one along,
        # so the shortest goes there, not into the share the other worker runs beside it
        order += [path, *([others.pop()] if len(others) > 1 else [])]
        due += ratio * length(path)
        first = True  # at least one: never two busy files in a row while others are left
        while others and (first or taken < due):
            taken += length(others[0])
            order.append(others.pop(0))
            first = False
    order += others
    position = {path: i for i, path in enumerate(order)}
    return sorted(items, key=lambda item: position[_path(item)])


KINDS = ("alone", "busy", "shared")


def kind_of(item: _Item) -> str:
    """How ``item`` shares the machine: its marker ``alone`` or ``busy``, else ``shared``."""
    return next((kind for kind in KINDS[:2] if item.get_closest_marker(kind) is not None), "shared")


@contextlib.contextmanager
def share_the_machine(kind: str) -> Iterator[None]:
    """Held around one test of ``kind`` (:data:`KINDS`): an ``alone`` test exclusively, any other shared, and a
    ``busy`` one exclusively among the ``busy`` ones (under xdist only)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    where = os.environ.get(SHARING_DIR)
    if worker_index() is None or not where:
        yield
        return
    with contextlib.ExitStack() as held:
        if kind == "busy":  # first, so that a busy test waiting for the other does not hold the machine's lock
            busy = held.enter_context(open(Path(where) / "busy", "a"))
            fcntl.flock(busy, fcntl.LOCK_EX)
            held.callback(fcntl.flock, busy, fcntl.LOCK_UN)
        turnstile = held.enter_context(open(Path(where) / "turnstile", "a"))
        lock = held.enter_context(open(Path(where) / "lock", "a"))
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if kind == "alone" else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        held.callback(fcntl.flock, lock, fcntl.LOCK_UN)
        yield
