"""tests/sharing.py: shared tests run side by side, an ``alone`` test runs with none beside it and is not kept out by
a stream of shared ones, a ``busy`` test runs beside shared ones but not beside another ``busy`` one, and each worker
pins to a core of its own. Threads stand for the workers (each open of the
lock file is a lock of its own, as another process's would be)."""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

import pytest
from sharing import SHARING_DIR, files_in_run_order, own_core, share_the_machine

NOT_YET_S = 0.3  # how long a holder that must wait is watched not getting in


class Holder:
    """One test's hold on the machine, in a thread: ``inside`` once it is in, it leaves on ``leave``."""

    def __init__(self, kind: str) -> None:
        self.inside, self.leave = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(kind,), daemon=True)
        self.thread.start()

    def _hold(self, kind: str) -> None:
        with share_the_machine(kind):
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
    first, second = Holder("shared"), Holder("shared")
    assert first.inside.wait(10) and second.inside.wait(10), "two shared tests run side by side"
    alone = Holder("alone")
    assert not alone.inside.wait(NOT_YET_S), "an alone test ran beside shared ones"
    late = Holder("shared")  # comes after the alone test: waits behind it (the turnstile)
    assert not late.inside.wait(NOT_YET_S), "a shared test slipped in ahead of the waiting alone one"
    first.done()
    second.done()
    assert alone.inside.wait(10)
    assert not late.inside.wait(NOT_YET_S), "a shared test ran beside an alone one"
    alone.done()
    assert late.inside.wait(10)
    late.done()


def test_a_busy_test_runs_beside_shared_ones_not_beside_another_busy_one_nor_an_alone_one(as_worker: None) -> None:
    busy, shared = Holder("busy"), Holder("shared")
    assert busy.inside.wait(10) and shared.inside.wait(10), "a busy test and a shared one run side by side"
    second = Holder("busy")
    assert not second.inside.wait(NOT_YET_S), "two busy tests ran side by side"
    busy.done()
    assert second.inside.wait(10), "the next busy test waits for the busy one only, not for the shared one"
    alone = Holder("alone")
    assert not alone.inside.wait(NOT_YET_S), "an alone test ran beside a busy and a shared one"
    second.done()
    assert not alone.inside.wait(NOT_YET_S), "an alone test ran beside a shared one"
    shared.done()
    assert alone.inside.wait(10)
    third = Holder("busy")
    assert not third.inside.wait(NOT_YET_S), "a busy test ran beside an alone one"
    alone.done()
    assert third.inside.wait(10)
    third.done()


def test_an_unknown_kind_is_refused(as_worker: None) -> None:
    with pytest.raises(ValueError, match="kind 'quiet': one of alone, busy, shared"), share_the_machine("quiet"):
        pass


def test_without_workers_nothing_is_locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv(SHARING_DIR, str(tmp_path))
    first, second = Holder("alone"), Holder("alone")
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


def test_the_alone_files_come_first_then_each_busy_file_longest_first_with_others_lasting_as_long(
    request: pytest.FixtureRequest,
) -> None:
    items = [_Item("a.py::x"), _Item("b.py::x"), _Item("b.py::y", "alone"), _Item("c.py::x"), _Item("d.py::x", "alone"),
             _Item("e.py::x"), _Item("e.py::y", "slow"), _Item("f.py::x", "slow"), _Item("g.py::x"),
             _Item("h.py::x", "busy"), _Item("i.py::x", "busy"), _Item("j.py::x")]  # fmt: skip
    # busy: h 10 s, i 30 s; the others 80 s: shares of 80 / (40 + 20) = 4/3 of each busy file's seconds
    seconds = {"a.py": 5, "c.py": 30, "e.py": 20, "f.py": 9, "g.py": 1, "h.py": 10, "i.py": 30, "j.py": 15}
    assert [i.nodeid for i in files_in_run_order(items, seconds)] == [
        "b.py::x", "b.py::y", "d.py::x",  # alone, in their order
        "i.py::x", "g.py::x",  # the longest busy file, the shortest other (its worker takes it along),
        "c.py::x", "e.py::x", "e.py::y",  # then 50 s of the others, longest first
        "h.py::x", "a.py::x", "j.py::x",  # 15 s after the 10 s one
        "f.py::x",  # the rest for the end
    ]  # fmt: skip
    # a file not in the table: 20 s where it holds a slow test (e, f), else 2 s: 48 s of others, shares of 8 times
    assert [i.nodeid for i in files_in_run_order(items, {})][3:8] == [
        "h.py::x", "j.py::x", "e.py::x", "e.py::y", "i.py::x"
    ]  # fmt: skip

    # and so is this session ordered (tests/conftest.py): the alone files first, each busy file followed by others
    files = list(dict.fromkeys(i.nodeid.split("::")[0] for i in request.session.items))

    def kinds(path: str) -> set[str]:
        return {m.name for i in request.session.items if i.nodeid.startswith(path + "::") for m in i.iter_markers()}

    alone = [f for f in files if "alone" in kinds(f)]
    assert files[: len(alone)] == alone
    busy = [i for i, f in enumerate(files) if "busy" in kinds(f) and "alone" not in kinds(f)]
    assert all(b - a > 1 for a, b in itertools.pairwise(busy)), "two busy files one after the other"
