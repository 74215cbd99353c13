"""How well a fill job's profile fills a rank's bubbles, in one unit every job and rank share.

The unit is PipeFill's normalized work (the one :func:`pipefill.plan.assign_jobs` uses): the dedicated-device seconds
of the job that one second of the rank's wall time yields, per bubble class. For class ``c`` of a rank with training
step ``step_s`` and job profile ``P`` (planned by :func:`pipefill.plan.plan_class`, the executor's own rule)::

    v_c = samples_per_bubble(c, P) × count_per_step(c) ÷ step_s ÷ best_throughput(P)

so ``Σ v_c`` ≤ the rank's bubble fraction, with equality for a job that uses every bubble second at its best speed.
A job with no measured profile is planned from its spec estimate (one step of one unit at the estimated time and
memory); with neither, it is assumed to use half of every class that has the estimated memory (until profiled).
Values are cached per (profile, rank capacity): ranks of equal training jobs and jobs of one workload share them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TypeVar

from pipefill.plan import BubbleClass, ProfilePoint, plan_class
from pipefill.plan.bulk import StepPoint, step_points, units_per_class, usable_classes
from pipefill.queue.snapshot import FillJobView

__all__ = ["UNKNOWN_RANK_SPEED", "UNKNOWN_SHARE", "Demand", "RankCapacity", "Rates", "demand_of", "why_unfit"]

_T = TypeVar("_T")

UNKNOWN_SHARE = 0.5
"""Fraction of a class's bubble time a job without profile or estimates is assumed to use (until profiled)."""
UNKNOWN_RANK_SPEED = 0.01
"""Normalized work per second assumed of a rank whose bubbles are not known: positive, so it hosts work, and below
what known ranks offer typically (a bubble fraction of 10–50 % well used), so they are preferred."""


@dataclass(frozen=True)
class RankCapacity:
    """A rank's bubble classes per training step, its step time and the fill's guard. ``known`` is false for a rank
    that reported nothing and whose prediction offers no bubble worth announcing (a model the GPU cost model makes
    microseconds fast, a job training on CPU, a custom schedule without its CSV): such a rank is taken to fit every
    job until its executor reports (an unfit report then steers the job away); makespan puts one job at a time
    there and prefers known ranks."""

    classes: tuple[BubbleClass, ...]
    step_s: float
    guard_s: float
    known: bool = True

    @property
    def bubble_fraction(self) -> float:
        """Bubble seconds per wall second (what the fill could use at most)."""
        return sum(c.duration_s * c.count_per_step for c in self.classes) / self.step_s


@dataclass(frozen=True)
class Demand:
    """What a job needs of a bubble: its profile (measured or from the spec's estimate); ``points`` empty means
    unknown, then only ``peak_bytes`` (the memory estimate, 0 when none) is checked."""

    points: tuple[ProfilePoint, ...]
    peak_bytes: int = 0

    @property
    def known(self) -> bool:
        return bool(self.points)

    @functools.cached_property
    def best_units_per_s(self) -> float:
        """Units of work per second at the fastest batch size, memory ignored: the job on a dedicated device."""
        return max((p.items / p.step_s for p in self.points), default=0.0)

    def dedicated_s(self, units: int) -> float | None:
        """Seconds ``units`` of work take on a dedicated device; None when the job has no profile or estimate."""
        best = self.best_units_per_s
        return units / best if best > 0 else None


def demand_of(job: FillJobView) -> Demand:
    """The job's measured profile, else its estimate (one unit per step), else unknown."""
    if job.profile:
        return Demand(tuple(job.profile))
    peak = job.estimate_peak_bytes or 0
    if job.estimate_step_s is not None and job.estimate_step_s > 0:
        return Demand((ProfilePoint(1, job.estimate_step_s, peak),), peak)
    return Demand((), peak)


class Rates:
    """Per-class normalized work ``v_c`` of (demand, capacity) pairs, computed once per pass and pair. Demands and
    capacities are interned to small integers once (hashing them per lookup would cost more than the lookup)."""

    def __init__(self) -> None:
        self.demands: list[Demand] = []
        self.caps: list[RankCapacity] = []
        self._demand_ids: dict[Demand, int] = {}
        self._cap_ids: dict[RankCapacity, int] = {}
        self._rates: dict[tuple[int, int], tuple[float, ...]] = {}
        self._speeds: dict[tuple[int, int], float] = {}
        self._by_job_key: dict[tuple[object, ...], tuple[Demand, int]] = {}
        self._points: dict[int, tuple[StepPoint, ...]] = {}  # per demand id, for units_per_class
        self._usable: dict[int, list[tuple[float, int]]] = {}  # per capacity id, for units_per_class

    def demand_id(self, demand: Demand) -> int:
        return self._intern(demand, self._demand_ids, self.demands)

    def demand_id_of(self, job: FillJobView) -> tuple[Demand, int]:
        """The job's demand and its id, keyed by the raw numbers (cheaper to hash than the frozen dataclasses)."""
        key = (
            tuple((p.batch_size, p.step_s, p.peak_bytes, p.items_per_step) for p in job.profile),
            job.estimate_step_s,
            job.estimate_peak_bytes,
        )
        found = self._by_job_key.get(key)
        if found is None:
            demand = demand_of(job)
            found = self._by_job_key[key] = (demand, self.demand_id(demand))
        return found

    def cap_id(self, cap: RankCapacity) -> int:
        return self._intern(cap, self._cap_ids, self.caps)

    def per_class(self, demand_id: int, cap_id: int) -> tuple[float, ...]:
        key = (demand_id, cap_id)
        found = self._rates.get(key)
        if found is None:
            demand, cap = self.demands[demand_id], self.caps[cap_id]
            if not demand.known:
                found = _unknown_per_class(demand, cap)
            else:
                points = self._points.get(demand_id)
                if points is None:
                    points = self._points[demand_id] = step_points(demand.points)
                usable = self._usable.get(cap_id)
                if usable is None:
                    usable = self._usable[cap_id] = usable_classes(cap.classes, guard_s=cap.guard_s)
                scale = 1.0 / (cap.step_s * demand.best_units_per_s)
                units = units_per_class(usable, points)
                found = tuple(n * c.count_per_step * scale for n, c in zip(units, cap.classes, strict=True))
            self._rates[key] = found
        return found

    def speed(self, demand_id: int, cap_id: int) -> float:
        """``Σ v_c``: the job's normalized work per second on the rank, alone there."""
        key = (demand_id, cap_id)
        found = self._speeds.get(key)
        if found is None:
            known = self.caps[cap_id].known
            found = self._speeds[key] = sum(self.per_class(demand_id, cap_id)) if known else UNKNOWN_RANK_SPEED
        return found

    def fits(self, demand_id: int, cap_id: int) -> bool:
        return self.speed(demand_id, cap_id) > 0

    @staticmethod
    def _intern(value: _T, ids: dict[_T, int], values: list[_T]) -> int:
        found = ids.get(value)
        if found is None:
            found = ids[value] = len(values)
            values.append(value)
        return found


def why_unfit(demand: Demand, cap: RankCapacity) -> str:
    """The planner's reason why no class of ``cap`` fits ``demand`` (of its longest class)."""
    if not cap.classes:
        return "the rank has no bubble classes (none long enough to be announced)"
    longest = max(cap.classes, key=lambda c: c.duration_s)
    if not demand.known:
        return f"the estimated memory {demand.peak_bytes} bytes exceeds every bubble's free memory"
    return plan_class(longest, demand.points, guard_s=cap.guard_s).reason


def _unknown_per_class(demand: Demand, cap: RankCapacity) -> tuple[float, ...]:
    """A job with neither profile nor estimate: :data:`UNKNOWN_SHARE` of every class with the estimated memory."""
    return tuple(
        UNKNOWN_SHARE * c.duration_s * c.count_per_step / cap.step_s if c.free_bytes >= demand.peak_bytes else 0.0
        for c in cap.classes
    )
