"""Inside a bubble, a job's profile: its measurement steps while they fit (:func:`run_profile_steps`), and whether
the next one is taken between bubbles instead (:func:`due_between`). Nothing unpredicted runs in a bubble."""

from __future__ import annotations

import time
from collections.abc import Callable

from pipefill_fill.inbubble import BubbleOutcome, OpenBubble
from pipefill_fill.profiler import BubbleProfiler
from pipefill_fill.steptrace import StepTrace, mark

__all__ = ["PROFILE_MISSES", "due_between", "run_profile_steps"]

PROFILE_MISSES = 8
"""Bubbles in a row in which a profile's next measurement did not run before its candidate batch size is given up, or
— the first size, nothing measured yet — before it is measured between bubbles (:func:`due_between`)."""


def due_between(profiler: BubbleProfiler) -> bool:
    """Whether the profile's next measurement is taken between bubbles, not in one: nothing is measured yet, and
    nothing predicts what the measurement takes, or it fitted none of the last :data:`PROFILE_MISSES` bubbles. The
    first size is never given up (its slow steps may have been interrupted ones; without it there is no profile), and
    measured in a bubble whatever its prediction it overran each by what it did not fit (issue #31: 14–42 bubbles of
    a job too large for 2 ms ones, up to 9.8 ms past their ends, before its verdict). Between bubbles, at the
    executor's priority, it runs as the warm-up does (:meth:`pipefill_fill.dispatch.Dispatcher.measure_between`).
    So is a later size's retry after its stretched measurements were dropped (``retry_due``: it may really be as slow
    as they said, and a bubble planned by its earlier sizes would then overrun by the difference)."""
    if profiler.result is not None:
        return False
    if profiler.retry_due:
        return True
    if profiler.measured:
        return False
    return profiler.misses >= PROFILE_MISSES or profiler.bound_s() is None


def run_profile_steps(
    bubble: OpenBubble,
    *,
    profiler: BubbleProfiler,
    is_open: Callable[[int], bool],
    deadline_ns: int,
    clock: Callable[[], int] = time.monotonic_ns,
) -> BubbleOutcome:
    """Measurement steps of ``profiler`` while they fit. The first size's steps are measured one piece at a time
    (where the workload runs its steps in pieces) when a whole one does not fit; what fits no bubble of it is measured
    between bubbles (:func:`due_between`). Nothing unpredicted runs in a bubble.

    A bubble in which the next measurement did not run counts as a miss, whatever the reason (a step predicted to fit
    a fresh bubble can still never fit after the wake-up); after :data:`PROFILE_MISSES` in a row the candidate is
    given up (the profile ends with the sizes measured so far), or — the first size, nothing measured yet — measured
    between bubbles until its measurements predict that it fits. So a profile takes at most (warm-up + measured steps
    + :data:`PROFILE_MISSES`) bubbles per candidate. ``out.stop`` is "time" when the next measurement did not fit the
    time left (the rest of the bubble may go to work that fits: :mod:`pipefill_fill.dispatch`), "done" when an
    inference job's measured steps did the last of its slice's work (they are its work: ``out.items``)."""
    out = BubbleOutcome()
    while profiler.result is None:
        if profiler.out_of_work():  # its measured steps did the slice's last work: the rest goes to another job
            out.stop = "done"
            break
        start = clock()
        if due_between(profiler):
            out.stop = "time"
            break
        whole = None if profiler.mid_step else profiler.bound_s()  # conservative: a first look at a size's cost
        # the first size, where its whole step does not fit: one piece at a time where the workload runs steps in
        # pieces; a larger size must fit whole, else it is given up
        piecewise = profiler.mid_step or (
            not profiler.measured and (whole is None or start + int(1e9 * whole) > deadline_ns)
        )
        guess = profiler.next_bound_s() if piecewise else whole
        if guess is None or start + int(1e9 * guess) > deadline_ns:
            out.stop = "time"
            break
        if not is_open(bubble.id):
            out.stop = "closed"
            break
        before_mark, batch_size = mark(), profiler.batch_size
        if piecewise:
            profiler.measure_next()
        else:
            profiler.measure_one()
        profiler.misses = 0
        end = clock()
        out.traces.append(StepTrace.between(before_mark, mark(), host_ns=end - start))  # it synchronizes itself
        out.startup_steps.add(len(out.spans_ns))  # profiling is the job's start: first calls of every size
        out.spans_ns.append((start, end))
        out.batch_sizes.append(batch_size if profiler.productive else 0)  # 0: a profiling step that does no work
        out.items += profiler.last_items  # an inference job's measured steps are its work
        out.kinds.append("m")
        out.steps += 1
        out.busy_ns += end - start
    if not out.steps and out.stop == "time" and profiler.result is None:
        profiler.misses += 1  # no measurement in this bubble
        if profiler.misses >= PROFILE_MISSES and profiler.measured:
            profiler.give_up_candidate()
    return out
