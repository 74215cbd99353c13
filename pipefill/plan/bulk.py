"""The planner's answer in bulk: how many units of work one bubble of a class holds for a profile, for scoring many
(job, rank) pairs at once (the fill queue scores every job kind on every rank with a free slot in each pass).

Same rule as :func:`pipefill.plan.plan_class` — the batch size whose whole steps, back to back, do the most units
while fitting the bubble's free memory and ending ``guard_s`` before it — without building a plan per candidate;
a test checks that both agree on random classes and profiles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipefill.plan.planner import _EPS, BubbleClass, ProfilePoint

__all__ = ["samples_per_bubble"]


def samples_per_bubble(bubble: BubbleClass, profile: Sequence[ProfilePoint], *, guard_s: float) -> int:
    """``plan_class(bubble, profile, guard_s=guard_s).samples_per_bubble`` (0 when the class is skipped)."""
    usable_s = bubble.duration_s - guard_s
    if usable_s <= 0:
        return 0
    best = 0
    for p in profile:
        if p.peak_bytes <= bubble.free_bytes:
            units = math.floor(usable_s / p.step_s + _EPS) * p.items
            if units > best:
                best = units
    return best
