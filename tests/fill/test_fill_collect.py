"""The garbage collector runs between bubbles only (issue #31: a full collection inside a bubble overran it by
0.2–0.3 s)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from pipefill_fill import collect


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _frozen(obj: object) -> bool:
    """Whether ``obj`` is in the permanent generation (``gc.freeze``): the collector lists it in no generation."""
    return not any(o is obj for o in gc.get_objects())


def test_no_collection_starts_by_itself_and_the_due_one_runs_between_bubbles() -> None:
    runs: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            runs.append(info["collected"])

    was_enabled = gc.isenabled()
    gc.callbacks.append(seen)
    try:
        collect.start()
        assert not gc.isenabled() and gc.get_freeze_count() > 0  # what the start left is frozen
        runs.clear()
        for _ in range(20 * gc.get_threshold()[0]):  # far past the threshold: a collection would have started
            _Cycle()
        assert runs == []  # inside a bubble: none
        assert collect.between_bubbles() >= 0 and runs and sum(runs) > 0  # after it: the cycles are gone
        runs.clear()
        assert collect.between_bubbles() == -1 and runs == []  # nothing due
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()
        collect.stop()
        if not was_enabled:
            gc.disable()


def test_what_was_frozen_stays_frozen_until_a_new_model_follows_an_instance_let_go_of() -> None:
    """A launcher freezes its preload before forking the executor (pipefill/local/forker.py): neither the executor's
    start nor its first slice walks those objects again, nor a second workload's first slice while the executor keeps
    both instances; a new model after an instance was let go of (its frozen objects may be garbage) collects
    everything."""
    was_enabled = gc.isenabled()
    before = _Cycle()  # garbage frozen with the launcher's objects: a full collection would free it
    gone = weakref.ref(before)
    del before
    gc.freeze()
    try:
        collect.start()
        collect.after_startup(full=True)  # the first slice: nothing of an earlier one is frozen
        assert gone() is not None
        collect.after_startup(full=False)  # the same workload again
        assert gone() is not None
        collect.after_startup(full=True)  # another workload, both instances kept: no walk of the frozen
        assert gone() is not None
        collect.instance_dropped()  # a third workload evicted the first's instance
        collect.after_startup(full=True)  # the earlier slices' leftovers go, and this with them
        assert gone() is None
        later = _Cycle()  # frozen garbage of a kept instance's start-up
        later_gone = weakref.ref(later)
        del later
        gc.freeze()
        collect.after_startup(full=True)  # nothing let go of since: no walk again
        assert later_gone() is not None
    finally:
        gc.unfreeze()
        collect.stop()
        if not was_enabled:
            gc.disable()


def test_a_slice_that_reuses_its_model_freezes_nothing_and_its_leftovers_go_at_the_next_one() -> None:
    """A reused model's slices leave nothing among the frozen objects: no full collection (a walk of torch's objects,
    1.1–1.8 s at idle priority) is ever needed to free their leftovers."""
    was_enabled = gc.isenabled()
    try:
        collect.start()
        collect.after_startup(full=True)  # the model built: frozen
        frozen = gc.get_freeze_count()
        slice_data = _Cycle()  # a reused slice's own objects
        gone = weakref.ref(slice_data)
        collect.after_startup(full=False)
        # not frozen, still in use (the count may fall: frozen objects freed by reference counting, in any thread)
        assert not _frozen(slice_data) and gc.get_freeze_count() <= frozen and gone() is not None
        del slice_data  # the slice ended, its objects a cycle
        collect.after_startup(full=False)  # the next slice of the same model
        assert gone() is None and gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
        collect.stop()
        if not was_enabled:
            gc.disable()
