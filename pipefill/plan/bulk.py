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

__all__ = ["samples_per_bubble"]


def samples_per_bubble(classes: Sequence[BubbleClass], profile: Sequence[ProfilePoint], *, guard_s: float) -> list[int]:
    """Per class, ``plan_class(c, profile, guard_s=guard_s).samples_per_bubble`` (0 where the class is skipped)."""
    points = [(p.peak_bytes, p.step_s, p.items) for p in profile]
    floor = math.floor
    out = []
    for c in classes:
        usable_s, free = c.duration_s - guard_s, c.free_bytes
        best = 0
        if usable_s > 0:
            for peak, step_s, items in points:
                if peak <= free:
                    units = floor(usable_s / step_s + _EPS) * items
                    if units > best:
                        best = units
        out.append(best)
    return out
