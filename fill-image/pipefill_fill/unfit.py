"""What an executor tells the queue about its rank: the bubble classes it measured, and whether a job fits none of
them (``status.unfit``: no bubble long enough, or not enough device memory, with the numbers), so the operator's next
pass places the job elsewhere. Torch-free: it reads the profiler's results, never runs anything."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from pipefill.plan import ObservedBubble, classes_from_bubbles
from pipefill.queue.status import Identity
from pipefill.spec.fillstatus import BubbleClassReport, RankBubbles, UnfitReason, UnfitReport

__all__ = [
    "LONGEST_QUANTILE",
    "MIN_BUBBLES_SEEN",
    "STARVED_BUBBLES",
    "STARVED_SHARE",
    "bubble_classes",
    "starved_report",
    "unfit_report",
    "unit_s",
]

MIN_BUBBLES_SEEN = 16
"""A job with a measured profile is called too long for the rank's bubbles only after this many bubbles were seen:
a few early ones (a warming trainer, a loaded machine) must not send a job away for good."""
LONGEST_QUANTILE = 0.95
"""The rank's "longest" bubble, for a job to fit: this quantile of the lengths seen, not the very longest. One bubble
that ran long (10 ms announced, 14.9 ms measured: the trainer late to close it) made sentence-embedding, whose 10.5 ms
piece fits no 10 ms bubble, "fit" the rank, where the planner (which plans for a bubble's announced length) never ran
it: 16 000 bubbles without a step, and no verdict. Bubbles long one time in ten or more still count."""

STARVED_BUBBLES = 512
"""A profiled job is looked at again every this many bubbles offered to it that it ran steps in, or ran nothing in
because nothing fitted the time left (``stop: time``): when fewer than :data:`STARVED_SHARE` of them had steps, it is
left for another executor as one no bubble of this rank is long enough for. The check at its profile
(:func:`unfit_report`) compares its shortest unit with the bubbles' lengths less the guard; the planner also takes the
wake-up and the unit's learnt margin, so a unit a little shorter than the usable bubble can still (almost) never run:
`pipefill bench fill --life` at 2 ms found the encoder's job taking 12 692 bubbles, steps in 14, until the benchmark
gave up; the next job of its kind, when the first was given up, ran steps in 3 of 200. 512 bubbles are a few seconds
of a training's bubbles."""
STARVED_SHARE = 1 / 32
"""See :data:`STARVED_BUBBLES`: a job with steps in fewer than one in 32 of its bubbles gets almost nothing from this
rank, and the steps it does run are the ones that only just fitted. Nor does one that completed no batch in them:
`pipefill bench fill --life` at 2 ms found train-classifier's pieces running in one bubble in four for 400 s, each
batch dropped before its last piece (a later one fitted no bubble), nothing committed."""


class _Point(Protocol):
    @property
    def step_s(self) -> float: ...

    @property
    def peak_bytes(self) -> int: ...


class _Profiler(Protocol):
    stopped_by: str
    last_step_s: float | None
    last_peak_bytes: int | None


def bubble_classes(bubbles: Sequence[ObservedBubble], *, identity: Identity, free_bytes: int) -> RankBubbles | None:
    """This rank's bubble classes from the bubbles it saw lately (None before any closed). ``perStep`` counts the
    class's bubbles against the most frequent kind's, the one every training step has once per microbatch; a rank
    whose kinds differ only in length reports each class once per step."""
    if not bubbles:
        return None
    per_kind: dict[str, int] = {}
    for b in bubbles:
        per_kind[b.kind] = per_kind.get(b.kind, 0) + 1
    steps = max(1, max(per_kind.values()))
    classes = classes_from_bubbles(bubbles, training_steps=steps, default_free_bytes=free_bytes)
    return RankBubbles(
        identity.training_job,
        identity.rank,
        [
            BubbleClassReport(round(c.duration_s * 1e3, 3), round(c.count_per_step, 3), min(c.free_bytes, free_bytes))
            for c in classes[:32]
            if c.count_per_step > 0
        ],
    )


def unfit_report(
    profiler: _Profiler,
    points: Sequence[_Point],
    bubbles: Sequence[ObservedBubble],
    *,
    identity: Identity,
    free_bytes: int,
    guard_s: float,
) -> UnfitReport | None:
    """Why the job fits none of this rank's bubbles, with the numbers; None when it fits one.

    Not enough memory: no batch size was kept and the last one tried went over ``free_bytes`` (or ran out of device
    memory). No bubble long enough: the job's shortest measured step (or, in pieces, its longest piece) is longer than
    the longest of at least :data:`MIN_BUBBLES_SEEN` bubbles seen (:data:`LONGEST_QUANTILE`), less the guard (or the
    profile stopped on time before a batch size was kept)."""
    longest_ms = _longest_usable_ms(bubbles, guard_s)
    if not points:
        if profiler.stopped_by == "work":
            return None  # the slice had no work left to measure with: nothing says the job does not fit
        if profiler.stopped_by == "memory" or profiler.last_step_s is None:
            peak = profiler.last_peak_bytes
            return UnfitReport(
                identity.training_job,
                identity.rank,
                UnfitReason.NOT_ENOUGH_MEMORY,
                f"not enough device memory: the smallest batch needs {_size(peak)}, this rank's fill may use "
                f"{_size(free_bytes)}",
                longest_bubble_milliseconds=longest_ms,
                free_bytes=free_bytes,
                peak_memory_bytes=peak,
            )
        return _too_short(identity, round(profiler.last_step_s * 1e3, 3), longest_ms, free_bytes)
    if longest_ms is None or len(bubbles) < MIN_BUBBLES_SEEN:
        return None
    shortest = min(points, key=unit_s)  # a step in pieces (issue #25) needs a bubble for its longest piece only
    step_ms = round(unit_s(shortest) * 1e3, 3)
    if step_ms <= longest_ms:
        return None
    return _too_short(identity, step_ms, longest_ms, free_bytes, peak=shortest.peak_bytes)


def starved_report(
    starved: int,
    worked: int,
    shortest_unit_s: float,
    bubbles: Sequence[ObservedBubble],
    *,
    identity: Identity,
    free_bytes: int,
    guard_s: float,
    completed: int = 1,
) -> UnfitReport:
    """A profiled job fitted nothing in ``starved`` of its last ``starved + worked`` bubbles (:data:`STARVED_BUBBLES`),
    or (``completed`` 0) completed no batch in any: no bubble long enough, as the planner sees them (the numbers: its
    shortest step or piece, the longest usable bubble)."""
    longest_ms = _longest_usable_ms(bubbles, guard_s)
    if completed:
        why = (
            f"nothing of the job fitted the time left in {starved} of its last {starved + worked} bubbles (after the "
            "wake-up, the guard and the step's learnt margin); its shortest step or piece"
        )
    else:
        why = (
            f"the job ran pieces in {worked} of its last {starved + worked} bubbles and completed no batch in any "
            "(its batch in flight was dropped where a later piece fitted none, after the wake-up, the guard and the "
            "step's learnt margin); its shortest step or piece"
        )
    return _too_short(identity, round(shortest_unit_s * 1e3, 3), longest_ms, free_bytes, what=why)


def unit_s(point: _Point) -> float:
    """The longest part of ``point``'s step a bubble must hold: the whole step, or its longest piece."""
    return max(getattr(point, "piece_s", ()) or (point.step_s,))


def _longest_usable_ms(bubbles: Sequence[ObservedBubble], guard_s: float) -> float | None:
    """The rank's "longest" bubble (:data:`LONGEST_QUANTILE` of the lengths seen) less the guard, ms; None: none seen."""
    lengths = sorted(b.duration_s for b in bubbles)
    if not lengths:
        return None
    return round(max(0.0, lengths[math.ceil(LONGEST_QUANTILE * len(lengths)) - 1] - guard_s) * 1e3, 3)


def _too_short(
    identity: Identity,
    step_ms: float,
    longest_ms: float | None,
    free_bytes: int,
    *,
    peak: int | None = None,
    what: str = "the shortest step",
) -> UnfitReport:
    longest = "none seen yet" if longest_ms is None else f"{longest_ms:.3f} ms"
    return UnfitReport(
        identity.training_job,
        identity.rank,
        UnfitReason.BUBBLE_TOO_SHORT,
        f"no bubble long enough: {what} takes {step_ms:.3f} ms, this rank's longest usable bubble is {longest}",
        longest_bubble_milliseconds=longest_ms,
        step_milliseconds=step_ms,
        free_bytes=free_bytes,
        peak_memory_bytes=peak,
    )


def _size(n: int | None) -> str:
    return "an unknown amount" if n is None else f"{n} bytes ({n / 2**20:.1f} MiB)"
