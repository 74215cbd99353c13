"""The garbage collector runs between bubbles only (issue #31: a full collection inside a bubble overran it by
0.2–0.3 s)."""

from __future__ import annotations

import gc
from typing import Any

from pipefill_fill import collect


class _Cycle:
    def __init__(self) -> None:
        self.me = self


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
