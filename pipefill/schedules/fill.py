"""Projected fill capacity: how much of a fill workload fits in a timeline's bubbles.

A fill workload profile gives, per batch size, the seconds one step of the fill takes and its peak device memory.
Every bubble is planned with the execution planner's rule (:func:`pipefill.plan.plan_class`): the batch size whose
whole steps do the most samples while fitting the bubble's free memory and ending ``guard_s`` + ``switch_s`` before
the bubble does. Bubbles too short or too small for any batch stay empty.

Utilization gain = fill compute seconds ÷ training compute seconds, summed over ranks: how much more device time
does useful work. It counts fill seconds as worth as much as training seconds; a fill job that reaches a lower
fraction of the device's peak than the training gains proportionally less useful FLOPs.

Profile JSON: ``{"name": str, "guard_s": float, "switch_s": float,
"batches": [{"batch_size": int, "step_s": float, "peak_bytes": int}, …]}`` (``guard_s``, ``switch_s`` default 0).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipefill.plan import BubbleClass, ClassPlan, ProfilePoint, plan_class
from pipefill.schedules.timeline import BubbleSpan, Timeline

__all__ = ["FillProfile", "FillProjection", "project_fill"]

_UNLIMITED_BYTES = 1 << 62  # a bubble without a memory model: memory is not the limit


@dataclass(frozen=True)
class FillProfile:
    name: str
    points: tuple[ProfilePoint, ...]
    guard_s: float = 0.0
    """seconds the fill keeps free before a bubble's expected end; default 0"""
    switch_s: float = 0.0
    """seconds lost per used bubble to wake the fill and hand the device back; default 0"""

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> FillProfile:
        """Parse the profile JSON (see the module docstring)."""
        obj = json.loads(data) if isinstance(data, str) else data
        batches = obj.get("batches")
        if not isinstance(batches, list) or not batches:
            raise ValueError("fill profile 'batches' must be a non-empty list of {batch_size, step_s, peak_bytes}")
        points = []
        for pos, b in enumerate(batches):
            try:
                points.append(ProfilePoint(int(b["batch_size"]), float(b["step_s"]), int(b["peak_bytes"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(
                    f"fill profile batches[{pos}] needs batch_size, step_s and peak_bytes: {exc}"
                ) from None
        guard, switch = float(obj.get("guard_s", 0.0)), float(obj.get("switch_s", 0.0))
        if guard < 0 or switch < 0:
            raise ValueError(f"fill profile guard_s and switch_s must be seconds >= 0, got {guard} and {switch}")
        return cls(str(obj.get("name", "fill")), tuple(points), guard, switch)


@dataclass(frozen=True)
class BubblePlan:
    bubble: BubbleSpan
    plan: ClassPlan

    @property
    def samples(self) -> int:
        return self.plan.samples_per_bubble

    @property
    def filled_s(self) -> float:
        return self.plan.busy_s if self.plan.usable else 0.0


@dataclass(frozen=True)
class FillProjection:
    profile: FillProfile
    plans: tuple[tuple[BubblePlan, ...], ...]
    """per rank, one plan per bubble (``plan.usable`` is false where nothing fits, ``plan.reason`` says why)"""
    step_s: float
    busy_s: float
    """training compute seconds over all ranks"""
    idle_s: float
    """bubble seconds over all ranks"""

    @property
    def filled_s(self) -> float:
        return sum(p.filled_s for rank in self.plans for p in rank)

    @property
    def samples_per_step(self) -> int:
        return sum(p.samples for rank in self.plans for p in rank)

    @property
    def samples_per_s(self) -> float:
        """fill throughput of the whole pipeline (all ranks), samples per second of training"""
        return self.samples_per_step / self.step_s if self.step_s > 0 else 0.0

    @property
    def utilization_gain(self) -> float:
        return self.filled_s / self.busy_s if self.busy_s > 0 else 0.0

    @property
    def bubble_use(self) -> float:
        """fraction of the bubble time that runs fill work"""
        return self.filled_s / self.idle_s if self.idle_s > 0 else 0.0

    def rank_filled_s(self, rank: int) -> float:
        return sum(p.filled_s for p in self.plans[rank])

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.profile.name,
            "samples_per_step": self.samples_per_step,
            "samples_per_s": self.samples_per_s,
            "filled_s": self.filled_s,
            "bubble_use": self.bubble_use,
            "utilization_gain": self.utilization_gain,
        }


def plan_bubble(bubble: BubbleSpan, profile: FillProfile) -> BubblePlan:
    free = bubble.free_bytes if bubble.free_bytes is not None else _UNLIMITED_BYTES
    cls = BubbleClass(bubble.duration_s, free, name=f"rank {bubble.rank} {bubble.kind} @{bubble.start_s:g}s")
    return BubblePlan(bubble, plan_class(cls, profile.points, guard_s=profile.guard_s, switch_s=profile.switch_s))


def project_fill(timeline: Timeline, profile: FillProfile) -> FillProjection:
    """Plan every bubble of ``timeline`` for ``profile``; the totals say what the fill gains."""
    plans = tuple(tuple(plan_bubble(b, profile) for b in rt.bubbles) for rt in timeline.ranks)
    busy = sum(rt.busy_s for rt in timeline.ranks)
    idle = sum(timeline.idle_s(r) for r in range(len(timeline.ranks)))
    return FillProjection(profile, plans, timeline.step_s, busy, idle)
