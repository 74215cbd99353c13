"""Python's garbage collector between bubbles, never inside one.

The executor holds torch, a workload's model and data: hundreds of thousands of objects the cyclic collector
traverses in a full (generation 2) collection. Left automatic, such a collection starts whenever allocations cross a
threshold — in the middle of a bubble as often as not — and holds the filling thread for 0.2–0.3 s (measured in
``pipefill bench fill --workload train-classifier --life``: 233 and 282 ms; generations 0 and 1 took 1–5 ms); the
bubble overruns by that much, with the cause ``yield``. So the runner turns automatic collection off, collects the
generation that is due after each bubble is acknowledged (the thresholds are Python's own), and after a slice's
start-up collects everything and freezes the survivors (``gc.freeze``: later full collections skip them), so the
full collections between bubbles stay short. Objects freed by reference counting are freed as always.

Under ``pipefill local`` the executor is forked from a launcher that froze what it preloaded (torch, numpy, our
packages: pipefill/local/forker.py). Those objects stay frozen: neither the executor's start nor its first slice
unfreezes anything (nothing of an earlier slice is frozen yet), so the first job's start-up does not walk torch's
objects twice (0.28 s each on this project's 2-core machine kind, taken on a CPU from the bubbles). A later slice of
another workload still collects everything, the launcher's objects included, between bubbles.
"""

from __future__ import annotations

import gc

__all__ = ["after_startup", "between_bubbles", "start", "stop"]


FULL_EVERY = 16
"""A slice start-up that reused the previous instance of its workload collects only what is not frozen; every this
many in a row, one collects everything (the earlier slices' small cyclic leftovers that were frozen with them)."""

_light = 0
_opened = False  # a slice was opened since start: a full collection may find its leftovers among the frozen


def start() -> None:
    """Automatic collection off; what the executor's start left is collected and frozen, beside what was frozen
    before (a launcher's preload)."""
    global _light, _opened
    gc.disable()
    _light, _opened = 0, False
    gc.collect()
    gc.freeze()


def after_startup(*, full: bool = True) -> None:
    """A slice was opened (between bubbles): collect everything, a previous slice's cycles included, and freeze the
    survivors (the job's model and data, which live as long as the slice). ``full=False`` (the slice reused the
    model of the one before, which stays frozen): collect only what was allocated since the last freeze, which
    takes microseconds instead of the 0.1–0.3 s a full collection of torch's objects takes (a switch between small
    jobs of one workload would otherwise pay it in bubbles on a shared core); every :data:`FULL_EVERY` in a row is
    full all the same."""
    global _light, _opened
    full, _opened = full and _opened, True  # the first slice: nothing of an earlier one is frozen to collect
    _light = 0 if full or _light + 1 >= FULL_EVERY else _light + 1
    if _light == 0:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


def between_bubbles() -> int:
    """Collect the youngest generation whose threshold is crossed, as automatic collection would have, now that the
    bubble is acknowledged; returns the generation collected (-1: none was due)."""
    counts, thresholds = gc.get_count(), gc.get_threshold()
    due = -1
    for generation in range(3):
        if counts[generation] < thresholds[generation] or thresholds[generation] == 0:
            break
        due = generation
    if due >= 0:
        gc.collect(due)
    return due


def stop() -> None:
    gc.enable()
