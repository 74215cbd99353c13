"""tests/sharing.py: shared tests run side by side, an ``alone`` test runs with none beside it and is not kept out by
a stream of shared ones, and each worker pins to a core of its own. Threads stand for the workers (each open of the
lock file is a lock of its own, as another process's would be)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from sharing import SHARING_DIR, files_in_run_order, own_core, share_the_machine

NOT_YET_S = 0.3  # how long a holder that must wait is watched not getting in


class Holder:
    """One test's hold on the machine, in a thread: ``inside`` once it is in, it leaves on ``leave``."""

    def __init__(self, alone: bool) -> None:
        self.inside, self.leave = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(alone,), daemon=True)
        self.thread.start()

    def _hold(self, alone: bool) -> None:
        with share_the_machine(alone):
            self.inside.set()
            self.leave.wait(30)

    def done(self) -> None:
        self.leave.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def as_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv(SHARING_DIR, str(tmp_path))


def test_shared_tests_run_together_and_an_alone_one_waits_for_them_and_they_for_it(as_worker: None) -> None:
    first, second = Holder(alone=False), Holder(alone=False)
    assert first.inside.wait(10) and second.inside.wait(10), "two shared tests run side by side"
    alone = Holder(alone=True)
    assert not alone.inside.wait(NOT_YET_S), "an alone test ran beside shared ones"
    late = Holder(alone=False)  # comes after the alone test: waits behind it (the turnstile)
    assert not late.inside.wait(NOT_YET_S), "a shared test slipped in ahead of the waiting alone one"
    first.done()
    second.done()
    assert alone.inside.wait(10)
    assert not late.inside.wait(NOT_YET_S), "a shared test ran beside an alone one"
    alone.done()
    assert late.inside.wait(10)
    late.done()


def test_without_workers_nothing_is_locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv(SHARING_DIR, str(tmp_path))
    first, second = Holder(alone=True), Holder(alone=True)
    assert first.inside.wait(10) and second.inside.wait(10)
    first.done()
    second.done()
    assert not list(tmp_path.iterdir())


def test_each_worker_pins_to_a_core_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    cores = sorted(os.sched_getaffinity(0))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert own_core() == cores[0]
    got = []
    for worker in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        got.append(own_core())
    assert got == [cores[w % len(cores)] for w in range(3)]
    if len(cores) > 1:
        assert got[0] != got[1]


class _Item:
    def __init__(self, nodeid: str, marker: str = "") -> None:
        self.nodeid, self.marker = nodeid, marker

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == self.marker else None


def test_the_files_holding_an_alone_test_come_first_then_the_slow_ones_each_file_whole(
    request: pytest.FixtureRequest,
) -> None:
    items = [_Item("a.py::x"), _Item("b.py::x"), _Item("b.py::y", "alone"), _Item("c.py::x"), _Item("d.py::x", "alone"),
             _Item("e.py::x"), _Item("e.py::y", "slow"), _Item("f.py::x", "slow"), _Item("g.py::x")]  # fmt: skip
    assert [i.nodeid for i in files_in_run_order(items)] == [
        "b.py::x", "b.py::y", "d.py::x", "e.py::x", "e.py::y", "f.py::x", "a.py::x", "c.py::x", "g.py::x",
    ]  # fmt: skip

    # and so is this session ordered (tests/conftest.py): no file before one of a lower rank (alone 0, slow 1)
    def rank(path: str) -> int:
        marks = {m.name for i in request.session.items if i.nodeid.startswith(path + "::") for m in i.iter_markers()}
        return 0 if "alone" in marks else 1 if "slow" in marks else 2

    ranks = [rank(f) for f in dict.fromkeys(i.nodeid.split("::")[0] for i in request.session.items)]
    assert ranks == sorted(ranks)
