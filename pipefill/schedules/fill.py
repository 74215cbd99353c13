"""Projected fill capacity: how much of a fill workload fits in a timeline's bubbles.

A fill workload profile gives, per batch size, the seconds one step of the fill takes and its peak device memory,
and, for a workload whose steps run in pieces (issue #25: a layer of one batch at a time), each piece's seconds.
Two ways to fill (``steps``):

- ``"whole"``: every bubble is planned with the execution planner's rule (:func:`pipefill.plan.plan_class`): the
  batch size whose whole steps do the most samples while fitting the bubble's free memory and ending ``guard_s`` +
  ``switch_s`` before the bubble does. Bubbles too short or too small for any batch stay empty.
- ``"pieces"``: the fill executor's partial steps (:mod:`pipefill.schedules.fill_pieces`): each rank runs one batch
  size, piece after piece, in every bubble while the next piece ends ``guard_s`` before the bubble does (after the
  ``switch_s`` wake-up); the batch in flight waits on the device for the rank's next bubble, across the step's end.

Utilization gain = fill compute seconds ÷ training compute seconds, summed over ranks: how much more device time
does useful work. It counts fill seconds as worth as much as training seconds; a fill job that reaches a lower
fraction of the device's peak than the training gains proportionally less useful FLOPs.

Profile JSON: ``{"name": str, "guard_s": float, "switch_s": float,
"batches": [{"batch_size": int, "step_s": float, "peak_bytes": int}, …]}`` (``guard_s``, ``switch_s`` default 0);
a batch may add its pieces, ``"piece_s": [float, …]`` (each piece's seconds, in order) or ``"pieces": int`` (that
many equal pieces of ``step_s``). The fill executor's own profile record (the JSON of its profile cache:
``{"workload_id": str, "points": [{"batch_size", "step_s", "peak_bytes", "items_per_step", "piece_s"}, …]}``) is
read too; it has no guard or switch, so give them (``pipefill simulate --fill-guard-ms``, ``--fill-switch-ms``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipefill.plan import BubbleClass, ProfilePoint, plan_class
from pipefill.schedules.fill_pieces import BubbleFill, fill_rank_in_pieces
from pipefill.schedules.timeline import BubbleSpan, Timeline

__all__ = ["FILL_STEPS", "BubbleFill", "FillProfile", "FillProjection", "project_fill"]

FILL_STEPS = ("whole", "pieces")
_UNLIMITED_BYTES = 1 << 62  # a bubble without a memory model: memory is not the limit


@dataclass(frozen=True)
class FillProfile:
    name: str
    points: tuple[ProfilePoint, ...]
    guard_s: float = 0.0
    """seconds the fill keeps free before a bubble's expected end; default 0"""
    switch_s: float = 0.0
    """seconds lost per used bubble to wake the fill and hand the device back; default 0"""

    @property
    def has_pieces(self) -> bool:
        """Whether any batch size's steps run in pieces (more than one piece time)."""
        return any(len(p.piece_s) > 1 for p in self.points)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> FillProfile:
        """Parse the profile JSON or the fill executor's profile record (see the module docstring)."""
        obj = json.loads(data) if isinstance(data, str) else data
        if not isinstance(obj, Mapping):
            raise ValueError(f"fill profile must be a JSON object, got {type(obj).__name__}")
        key = "points" if "points" in obj and "batches" not in obj else "batches"
        batches = obj.get(key)
        if not isinstance(batches, list) or not batches:
            raise ValueError(
                f"fill profile '{key}' must be a non-empty list of {{batch_size, step_s, peak_bytes}} "
                "(optionally piece_s: [seconds, ...] or pieces: a count)"
            )
        points = [_point(f"{key}[{pos}]", b) for pos, b in enumerate(batches)]
        guard, switch = float(obj.get("guard_s", 0.0)), float(obj.get("switch_s", 0.0))
        if guard < 0 or switch < 0:
            raise ValueError(f"fill profile guard_s and switch_s must be seconds >= 0, got {guard} and {switch}")
        name = obj.get("name") or obj.get("workload_id") or "fill"
        return cls(str(name), tuple(points), guard, switch)


def _point(where: str, b: Any) -> ProfilePoint:
    try:
        step_s = float(b["step_s"])
        pieces = tuple(float(t) for t in b.get("piece_s") or ())
        count = b.get("pieces")
        if count is not None:
            if pieces:
                raise ValueError("give piece_s or pieces, not both")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"pieces must be a whole number >= 1, got {count!r}")
            pieces = (step_s / count,) * count if count > 1 else ()
        items = b.get("items_per_step")
        point = ProfilePoint(
            int(b["batch_size"]),
            step_s,
            int(b["peak_bytes"]),
            items_per_step=None if items is None else int(items),
            piece_s=pieces,
        )
        if pieces and not sum(pieces) > 0:  # each ≥ 0 (ProfilePoint checks): a batch that never ends
            raise ValueError(f"piece_s {list(pieces)} must add up to more than 0 seconds")
        return point
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(
            f"fill profile {where} needs batch_size, step_s and peak_bytes (optionally piece_s: [seconds, ...] "
            f"or pieces: a count): {exc}"
        ) from None


@dataclass(frozen=True)
class FillProjection:
    profile: FillProfile
    plans: tuple[tuple[BubbleFill, ...], ...]
    """per rank, one entry per bubble"""
    step_s: float
    busy_s: float
    """training compute seconds over all ranks"""
    idle_s: float
    """bubble seconds over all ranks"""
    steps: str = "whole"
    """how the fill runs: ``"whole"`` steps planned per bubble, or ``"pieces"`` (see the module docstring)"""

    @property
    def filled_s(self) -> float:
        return sum(p.filled_s for rank in self.plans for p in rank)

    @property
    def samples_per_step(self) -> float:
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

    def rank_batch_sizes(self) -> list[list[int]]:
        """per rank, the batch sizes its bubbles run"""
        return [sorted({p.batch_size for p in rank if p.batch_size is not None}) for rank in self.plans]

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.profile.name,
            "steps": self.steps,
            "samples_per_step": self.samples_per_step,
            "samples_per_s": self.samples_per_s,
            "filled_s": self.filled_s,
            "bubble_use": self.bubble_use,
            "utilization_gain": self.utilization_gain,
            "batch_sizes": self.rank_batch_sizes(),
        }


def plan_bubble(bubble: BubbleSpan, profile: FillProfile) -> BubbleFill:
    """The planner's whole steps in one bubble."""
    free = bubble.free_bytes if bubble.free_bytes is not None else _UNLIMITED_BYTES
    cls = BubbleClass(bubble.duration_s, free, name=f"rank {bubble.rank} {bubble.kind} @{bubble.start_s:g}s")
    plan = plan_class(cls, profile.points, guard_s=profile.guard_s, switch_s=profile.switch_s)
    if not plan.usable:
        return BubbleFill(bubble, None, 0.0, 0.0, reason=plan.reason)
    return BubbleFill(bubble, plan.batch_size, plan.busy_s, float(plan.samples_per_bubble))


def project_fill(timeline: Timeline, profile: FillProfile, *, steps: str | None = None) -> FillProjection:
    """Plan every bubble of ``timeline`` for ``profile``; the totals say what the fill gains. ``steps``: ``"whole"``
    or ``"pieces"`` (see the module docstring); None: pieces where the profile has them, else whole steps."""
    mode = steps if steps is not None else ("pieces" if profile.has_pieces else "whole")
    if mode not in FILL_STEPS:
        raise ValueError(f"fill steps {mode!r}: must be one of {', '.join(FILL_STEPS)}")
    if mode == "pieces" and not profile.has_pieces:
        raise ValueError(
            f"fill steps 'pieces': the fill profile {profile.name!r} has no piece times; give its batches "
            "piece_s: [seconds, ...] or pieces: a count, or fill with whole steps"
        )
    if mode == "pieces":
        plans = tuple(
            fill_rank_in_pieces(rt.bubbles, profile.points, guard_s=profile.guard_s, switch_s=profile.switch_s)
            for rt in timeline.ranks
        )
    else:
        plans = tuple(tuple(plan_bubble(b, profile) for b in rt.bubbles) for rt in timeline.ranks)
    busy = sum(rt.busy_s for rt in timeline.ranks)
    idle = sum(timeline.idle_s(r) for r in range(len(timeline.ranks)))
    return FillProjection(profile, plans, timeline.step_s, busy, idle, mode)
