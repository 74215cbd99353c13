"""Python's garbage collector between bubbles, never inside one.

The executor holds torch, a workload's model and data: hundreds of thousands of objects the cyclic collector
traverses in a full (generation 2) collection. Left automatic, such a collection starts whenever allocations cross a
threshold — in the middle of a bubble as often as not — and holds the filling thread for 0.2–0.3 s (measured in
``pipefill bench fill --workload train-classifier --life``: 233 and 282 ms; generations 0 and 1 took 1–5 ms); the
bubble overruns by that much, with the cause ``yield``. So the runner turns automatic collection off, collects the
generation that is due after each bubble is acknowledged (the thresholds are Python's own), and after the start-up
of a slice with a new model collects and freezes the survivors (``gc.freeze``: later full collections skip them), so
the full collections between bubbles stay short. Objects freed by reference counting are freed as always.

Frozen objects are walked again (unfrozen, everything collected) only where some may have become cyclic garbage: at
the start-up of a new model after the executor let go of an instance it had frozen (:func:`instance_dropped`: one
no longer kept for reuse). Under ``pipefill local`` the executor is forked from a launcher that froze what it
preloaded (torch, numpy, our packages: pipefill/local/forker.py). Walking them takes 0.2–0.3 s of a CPU on this
project's 2-core machine kind, taken from the bubbles: it used to happen at every new model but the first (in
``pipefill bench fill-queue``, 100 jobs of two workloads: at the second workload's first job, 0.2 s of each
executor's 2 s of CPU in a 150-step run), although the executor keeps both workloads' models for reuse.
"""

from __future__ import annotations

import gc

__all__ = ["after_startup", "between_bubbles", "instance_dropped", "start", "stop"]


_opened = False  # a slice was opened since start: a full collection may find its leftovers among the frozen
_dropped = False  # an instance frozen at its start-up is no longer kept: its objects may be frozen garbage


def start() -> None:
    """Automatic collection off; what the executor's start left is collected and frozen, beside what was frozen
    before (a launcher's preload)."""
    global _opened, _dropped
    gc.disable()
    _opened = _dropped = False
    gc.collect()
    gc.freeze()


def instance_dropped() -> None:
    """The executor let go of a workload instance (evicted from those kept for reuse, or none is kept): what was
    frozen with it may be garbage, collected at the next new instance's start-up."""
    global _dropped
    _dropped = True


def after_startup(*, full: bool = True) -> None:
    """A slice was opened (between bubbles). ``full`` (a new instance of its workload: a model built, modules
    imported): collect what is not frozen and freeze the survivors, which live on (the model); where an instance
    frozen before was let go of since (:func:`instance_dropped`; never at the first slice since the start), unfreeze
    and collect everything first, its cycles included. ``full=False`` (the slice reused the model of the one before,
    which stays frozen): collect what is not frozen (an earlier slice's leftovers, this slice's own objects) and
    freeze nothing, so nothing of a slice piles up among the frozen. It used to freeze them too, and every 16th such start-up unfroze and collected everything to free
    the leftovers: a walk of torch's objects that took 1.1–1.8 s of wall time at idle priority, a stall with no bubble
    filled (``pipefill bench fill-queue``, 20 jobs of one workload: twice per executor in 300 steps)."""
    global _opened, _dropped
    if full and _opened and _dropped:
        gc.unfreeze()
        _dropped = False
    _opened = True
    gc.collect()
    if full:
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
