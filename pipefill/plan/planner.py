"""The execution plan of one fill workload: per bubble class, the batch size and steps per bubble.

PipeFill's rule: for a bubble of ``duration_s`` with ``free_bytes`` of device memory, pick from the workload's profile the
batch size whose steps, run back to back, do the most samples while

* peak memory ≤ ``free_bytes − margin_bytes``, and
* ``steps × step_s ≤ duration_s − guard_s − switch_s − transfer_s``,

where ``switch_s`` is the measured wake-up and switch cost (bubble open → first step) and ``transfer_s`` the time offload
mode needs to bring the fill's state in and out. Classes where nothing fits are skipped, with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BubbleClass", "ClassPlan", "JobPlan", "ProfilePoint", "plan_class", "plan_job"]

# steps = floor(budget / step) must not lose a step to rounding (0.3 / 0.1 == 2.9999999999999996)
_EPS = 1e-9


@dataclass(frozen=True)
class BubbleClass:
    """Bubbles of one kind a rank offers: expected length, free device memory, how many per training step."""

    duration_s: float
    free_bytes: int
    count_per_step: float = 1.0
    name: str = ""

    def __post_init__(self) -> None:
        if not self.duration_s >= 0:
            raise ValueError(f"BubbleClass.duration_s: {self.duration_s!r} must be ≥ 0 seconds")
        if self.free_bytes < 0:
            raise ValueError(f"BubbleClass.free_bytes: {self.free_bytes!r} must be ≥ 0 bytes")
        if not self.count_per_step > 0:
            raise ValueError(f"BubbleClass.count_per_step: {self.count_per_step!r} must be > 0 bubbles per step")

    @property
    def label(self) -> str:
        return self.name or f"{self.duration_s * 1e3:g}ms:{_fmt_bytes(self.free_bytes)}"


@dataclass(frozen=True)
class ProfilePoint:
    """One measured (or estimated) batch size: median step time and peak device memory."""

    batch_size: int
    step_s: float
    peak_bytes: int
    items_per_step: int | None = None  # units of work one step does; None: batch_size (training by steps: 1)
    piece_s: tuple[float, ...] = ()
    """median seconds of each piece of a step run in pieces (issue #25: partial steps); empty: whole steps only"""

    @property
    def items(self) -> int:
        return self.batch_size if self.items_per_step is None else self.items_per_step

    def __post_init__(self) -> None:
        if self.items_per_step is not None and self.items_per_step < 1:
            raise ValueError(f"ProfilePoint.items_per_step: {self.items_per_step!r} must be ≥ 1 (or None: batch_size)")
        if self.batch_size < 1:
            raise ValueError(f"ProfilePoint.batch_size: {self.batch_size!r} must be ≥ 1")
        if not self.step_s > 0:
            raise ValueError(f"ProfilePoint.step_s: {self.step_s!r} must be > 0 seconds")
        if self.peak_bytes < 0:
            raise ValueError(f"ProfilePoint.peak_bytes: {self.peak_bytes!r} must be ≥ 0 bytes")
        if any(not t >= 0 for t in self.piece_s):
            raise ValueError(f"ProfilePoint.piece_s: {self.piece_s!r} must be ≥ 0 seconds each")


@dataclass(frozen=True)
class ClassPlan:
    """What to run in each bubble of one class; ``batch_size`` is None when the class is skipped (see ``reason``)."""

    bubble: BubbleClass
    batch_size: int | None
    steps_per_bubble: int
    step_s: float
    peak_bytes: int
    usable_s: float
    reason: str = ""
    items_per_step: int = 0

    @property
    def usable(self) -> bool:
        return self.batch_size is not None and self.steps_per_bubble > 0

    @property
    def samples_per_bubble(self) -> int:
        """Units of work per bubble: samples, or steps for a training job counted in steps."""
        return self.items_per_step * self.steps_per_bubble

    @property
    def busy_s(self) -> float:
        """Planned compute time per bubble (steps × step time)."""
        return self.steps_per_bubble * self.step_s

    def bubbles_needed(self, total_samples: int) -> int | None:
        """Bubbles of this class alone that ``total_samples`` takes; None when the class is skipped."""
        if not self.usable:
            return None
        return math.ceil(total_samples / self.samples_per_bubble)

    def to_dict(self, *, total_samples: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bubble": self.bubble.label,
            "bubble_ms": round(self.bubble.duration_s * 1e3, 6),
            "free_bytes": self.bubble.free_bytes,
            "count_per_step": self.bubble.count_per_step,
            "batch_size": self.batch_size,
            "steps_per_bubble": self.steps_per_bubble,
            "samples_per_bubble": self.samples_per_bubble,
            "busy_ms": round(self.busy_s * 1e3, 6),
            "usable_ms": round(self.usable_s * 1e3, 6),
            "utilization": round(self.busy_s / self.bubble.duration_s, 6) if self.bubble.duration_s > 0 else 0.0,
            "peak_bytes": self.peak_bytes if self.usable else None,
        }
        if total_samples is not None:
            out["bubbles_needed"] = self.bubbles_needed(total_samples)
        if self.reason:
            out["skipped"] = self.reason
        return out


@dataclass(frozen=True)
class JobPlan:
    """A workload's plan over all classes a rank offers, and how long ``total_samples`` takes."""

    classes: tuple[ClassPlan, ...]
    total_samples: int | None

    @property
    def samples_per_training_step(self) -> float:
        return sum(p.samples_per_bubble * p.bubble.count_per_step for p in self.classes)

    @property
    def training_steps_needed(self) -> int | None:
        per_step = self.samples_per_training_step
        if self.total_samples is None or per_step <= 0:
            return None
        return math.ceil(self.total_samples / per_step)

    def to_dict(self) -> dict[str, Any]:
        """One class: that class's plan as a flat object; several: ``{"classes": [...], ...}``."""
        if len(self.classes) == 1:
            return self.classes[0].to_dict(total_samples=self.total_samples)
        return {
            "classes": [p.to_dict(total_samples=self.total_samples) for p in self.classes],
            "samples_per_training_step": round(self.samples_per_training_step, 6),
            "training_steps_needed": self.training_steps_needed,
        }


def plan_class(
    bubble: BubbleClass,
    profile: Sequence[ProfilePoint],
    *,
    guard_s: float,
    switch_s: float = 0.0,
    transfer_s: float = 0.0,
    margin_bytes: int = 0,
    min_bubble_s: float = 0.0,
) -> ClassPlan:
    """The batch size and steps per bubble that do the most samples in ``bubble`` (see the module docstring).

    Ties go to the plan that leaves more slack (less busy time), then to less memory.
    """
    usable_s = bubble.duration_s - guard_s - switch_s - transfer_s
    memory_bytes = bubble.free_bytes - margin_bytes

    def skip(reason: str) -> ClassPlan:
        return ClassPlan(bubble, None, 0, 0.0, 0, max(usable_s, 0.0), reason)

    if not profile:
        return skip("no profile: the workload has not been profiled on this device")
    if bubble.duration_s < min_bubble_s:
        return skip(f"bubble {bubble.duration_s * 1e3:g} ms is shorter than the minimum {min_bubble_s * 1e3:g} ms")
    fits_memory = [p for p in profile if p.peak_bytes <= memory_bytes]
    if not fits_memory:
        smallest = min(profile, key=lambda p: p.peak_bytes)
        return skip(
            f"memory: the smallest batch ({smallest.batch_size}) needs {_fmt_bytes(smallest.peak_bytes)}, "
            f"the bubble offers {_fmt_bytes(bubble.free_bytes)} − margin {_fmt_bytes(margin_bytes)}"
        )
    best: ClassPlan | None = None
    for point in fits_memory:
        steps = math.floor(usable_s / point.step_s + _EPS) if usable_s > 0 else 0
        if steps < 1:
            continue
        cand = ClassPlan(bubble, point.batch_size, steps, point.step_s, point.peak_bytes, usable_s, "", point.items)
        if best is None or _better(cand, best):
            best = cand
    if best is None:
        fastest = min(fits_memory, key=lambda p: p.step_s)
        return skip(
            f"time: the fastest step that fits memory (batch {fastest.batch_size}) takes {fastest.step_s * 1e3:g} ms, "
            f"usable time is {usable_s * 1e3:g} ms (bubble − guard − switch − transfer)"
        )
    return best


def plan_job(
    classes: Iterable[BubbleClass],
    profile: Sequence[ProfilePoint],
    *,
    total_samples: int | None,
    guard_s: float,
    switch_s: float = 0.0,
    transfer_s: float = 0.0,
    margin_bytes: int = 0,
    min_bubble_s: float = 0.0,
) -> JobPlan:
    """:func:`plan_class` for every class, plus the totals."""
    plans = tuple(
        plan_class(
            c,
            profile,
            guard_s=guard_s,
            switch_s=switch_s,
            transfer_s=transfer_s,
            margin_bytes=margin_bytes,
            min_bubble_s=min_bubble_s,
        )
        for c in classes
    )
    return JobPlan(plans, total_samples)


def _better(a: ClassPlan, b: ClassPlan) -> bool:
    return (a.samples_per_bubble, -a.busy_s, -a.peak_bytes) > (b.samples_per_bubble, -b.busy_s, -b.peak_bytes)


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:g}{unit}"
    return f"{n}B"
