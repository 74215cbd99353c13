"""The planner's answer in bulk: how many units of work one bubble of each class holds for a profile, for scoring
many (job, rank) pairs at once (the fill queue scores every kind of job on every rank in each pass).

Same rule as :func:`pipefill.plan.plan_class` — the batch size whose whole steps, back to back, do the most units
while fitting the bubble's free memory and ending ``guard_s`` before it — without building a plan per candidate;
a test checks that both agree on random classes and profiles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipefill.plan.planner import _EPS, BubbleClass, ProfilePoint

__all__ = ["samples_per_bubble", "step_points", "units_per_class", "usable_classes"]

StepPoint = tuple[int, float, int]
"""A profile point as ``(peak_bytes, step_s, items)``."""


def samples_per_bubble(classes: Sequence[BubbleClass], profile: Sequence[ProfilePoint], *, guard_s: float) -> list[int]:
    """Per class, ``plan_class(c, profile, guard_s=guard_s).samples_per_bubble`` (0 where the class is skipped)."""
    return units_per_class(usable_classes(classes, guard_s=guard_s), step_points(profile))


def usable_classes(classes: Sequence[BubbleClass], *, guard_s: float) -> list[tuple[float, int]]:
    """The classes as :func:`units_per_class` takes them: ``(seconds usable after the guard, free bytes)``."""
    return [(c.duration_s - guard_s, c.free_bytes) for c in classes]


def step_points(profile: Sequence[ProfilePoint]) -> tuple[StepPoint, ...]:
    """The profile as :func:`units_per_class` takes it: plain tuples, least memory first."""
    return tuple(sorted((p.peak_bytes, p.step_s, p.items) for p in profile))


def units_per_class(usable: Sequence[tuple[float, int]], points: Sequence[StepPoint]) -> list[int]:
    """Per class (from :func:`usable_classes`), the units one bubble holds for ``points`` (from
    :func:`step_points`): the scorer's inner loop, with what is the same per class or profile
    computed once by the caller."""
    floor = math.floor
    out = []
    for usable_s, free in usable:
        best = 0
        if usable_s > 0:
            for peak, step_s, items in points:
                if peak > free:
                    break  # least memory first: no later point fits either
                units = floor(usable_s / step_s + _EPS) * items
                if units > best:
                    best = units
        out.append(best)
    return out
