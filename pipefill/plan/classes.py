"""Bubble classes from observed or simulated bubbles.

Before the first bubbles arrive, the planner's input is the timeline simulator's bubbles for this rank; afterwards, the
channel's ring of measured bubbles. Both are lists of (duration, free memory); bubbles whose lengths are within a
relative tolerance of each other form one class. A class is planned for its conservative length (a low quantile of its
members, so one long outlier cannot make the plan overrun the others) and its smallest free memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from pipefill.plan.planner import BubbleClass

__all__ = ["BubbleLike", "ObservedBubble", "classes_from_bubbles"]


class BubbleLike(Protocol):
    """Anything with a length, free memory (None: unknown) and kind: a simulator span or a measured bubble."""

    @property
    def duration_s(self) -> float: ...

    @property
    def free_bytes(self) -> int | None: ...

    @property
    def kind(self) -> str: ...


@dataclass(frozen=True)
class ObservedBubble:
    """One bubble, simulated or measured: its length and the device memory free during it."""

    duration_s: float
    free_bytes: int
    kind: str = ""


def classes_from_bubbles(
    bubbles: Iterable[BubbleLike],
    *,
    training_steps: float = 1.0,
    default_free_bytes: int = 0,
    rel_tolerance: float = 0.15,
    quantile: float = 0.1,
) -> list[BubbleClass]:
    """Group ``bubbles`` (observed over ``training_steps`` steps) into classes, longest first.

    ``rel_tolerance``: bubbles within this fraction of a class's shortest member join it (default 15%: what
    step-to-step jitter looks like on a loaded machine). ``quantile``: the member length the class is planned for.
    ``default_free_bytes``: free memory assumed where a bubble does not say (a simulation without a memory model).
    """
    if not training_steps > 0:
        raise ValueError(f"training_steps: {training_steps!r} must be > 0 (the steps the bubbles were observed over)")
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile: {quantile!r} must be within [0, 1]")
    ordered = sorted(bubbles, key=lambda b: b.duration_s)
    groups: list[list[BubbleLike]] = []
    for b in ordered:
        if groups and b.duration_s <= groups[-1][0].duration_s * (1.0 + rel_tolerance):
            groups[-1].append(b)
        else:
            groups.append([b])
    classes = []
    for group in reversed(groups):
        durations = [b.duration_s for b in group]  # already sorted
        idx = min(len(durations) - 1, max(0, math.ceil(quantile * len(durations)) - 1))
        kinds = sorted({b.kind for b in group if b.kind})
        classes.append(
            BubbleClass(
                duration_s=durations[idx],
                free_bytes=min(default_free_bytes if b.free_bytes is None else b.free_bytes for b in group),
                count_per_step=len(group) / training_steps,
                name="+".join(kinds) if kinds else "",
            )
        )
    return classes
