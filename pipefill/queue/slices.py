"""The slice plan of record: a fill job's units of work ``[0, total)`` divided into ranges, one holder each.

An inference job with ``spec.maxParallelRanks > 1`` is split into several slices per allowed rank, so a faster rank
takes more of them and the tail (the last slice, while other ranks have nothing left) is short. Training jobs and jobs
with ``maxParallelRanks: 1`` have one slice. The operator fixes the plan when it first schedules a job and hands out
its slices; the executors run exactly those ranges. Both compute it with :func:`plan_slices`, so they agree.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from pipefill.spec.fillstatus import MAX_SLICES

__all__ = ["MAX_SLICES", "MIN_SLICE_UNITS", "SLICES_PER_RANK", "Slice", "check_plan", "plan_bounds", "plan_slices"]

SLICES_PER_RANK = 4
"""Slices per allowed rank (spec.maxParallelRanks): several, so a faster rank takes more and the tail is short."""
MIN_SLICE_UNITS = 512
"""No slice is smaller than this many samples unless the FillJob says so (``spec.minSliceSamples``, whose default this
is): every slice costs its executor a start-up, commits, files of its own and a hand-over to the next through the
queue. At 64 (issue #30), a queue of 20 jobs of 256–1 024 samples was cut into slices of 64–128, each about one bubble
of the encoder's work, and a rank spent half of its bubble time between them."""


@dataclass(frozen=True, order=True)
class Slice:
    """Units of work ``[start, end)`` of one job (samples; steps for training, which is never split)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"a slice needs 0 ≤ start < end; got [{self.start}, {self.end})")

    @property
    def key(self) -> str:
        return f"{self.start:012d}-{self.end:012d}"

    def __str__(self) -> str:
        return f"[{self.start}, {self.end})"


def plan_slices(total: int, *, parallel_ranks: int, min_units: int = MIN_SLICE_UNITS) -> list[Slice]:
    """Equal slices of ``[0, total)``: ``SLICES_PER_RANK`` per rank, none below ``min_units`` (the FillJob's
    ``spec.minSliceSamples``); one slice when only one rank may work on the job."""
    bounds = plan_bounds(total, parallel_ranks=parallel_ranks, min_units=min_units)
    return [Slice(a, b) for a, b in itertools.pairwise(bounds)]


def plan_bounds(total: int, *, parallel_ranks: int, min_units: int = MIN_SLICE_UNITS) -> list[int]:
    """The bounds ``[0, b1, …, total]`` of :func:`plan_slices` (what ``slices.json`` and the status record)."""
    if min_units < 1:
        raise ValueError(f"min_units {min_units} must be ≥ 1 sample (spec.minSliceSamples)")
    count = 1 if parallel_ranks <= 1 else max(1, min(parallel_ranks * SLICES_PER_RANK, total // min_units))
    count = min(count, MAX_SLICES)  # the status holds the plan: its size is bounded
    return [total * i // count for i in range(count + 1)]


def check_plan(slices: Sequence[Slice], *, total: int, field: str = "slices") -> None:
    """Refuse a plan that does not tile ``[0, total)`` exactly (a gap or an overlap would lose or repeat samples)."""
    if not slices:
        raise ValueError(f"{field}: empty plan; a job of {total} units needs slices tiling [0, {total})")
    ordered = sorted(slices)
    if ordered[0].start != 0 or ordered[-1].end != total:
        raise ValueError(
            f"{field}: the plan covers [{ordered[0].start}, {ordered[-1].end}) but the job has {total} units; "
            f"slices must tile [0, {total}) (was the total changed after the job was planned?)"
        )
    for a, b in itertools.pairwise(ordered):
        if a.end != b.start:
            raise ValueError(
                f"{field}: slices {a} and {b} leave a gap or overlap; slices must tile [0, {total}) end to start"
            )
