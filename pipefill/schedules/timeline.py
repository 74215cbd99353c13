"""The simulated timeline of one training step: when each action runs on each rank, and every bubble.

Bubble kinds (``BubbleSpan.kind``), decided by where the idle gap sits in the rank's own action order:

- ``"warm-up"``: the gap ends at or before the rank's first backward (``B`` or ``I``): the rank waits for the pipeline
  to fill — its first input, or the first gradient to come back (this includes GPipe's gap between forwards and
  backwards);
- ``"steady"``: a later gap that still has forwards after it (both forward and backward work remain);
- ``"cool-down"``: a gap after the rank's last forward: only backward work remains while the pipeline drains;
- ``"end-of-step"``: from the end of the rank's step-end work (its last action + ``Costs.step_end_s``) to the end of
  the step, when the slowest rank is done. In a run of steps this merges with the next step's warm-up gap.

``before_action_idx`` is the index (into ``Schedule.ranks[rank]``) of the action that ends the bubble — the trainer
opens the bubble right before it would block on that action — or ``len(actions)`` for ``"end-of-step"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipefill.schedules.costs import Costs
from pipefill.schedules.memory import MemoryModel
from pipefill.schedules.model import Action, Schedule

__all__ = ["BUBBLE_KINDS", "ActionSpan", "BubbleSpan", "RankTimeline", "Timeline"]

BUBBLE_KINDS: tuple[str, ...] = ("warm-up", "steady", "cool-down", "end-of-step")


@dataclass(frozen=True, slots=True)
class ActionSpan:
    """One action as simulated: it runs on its rank from ``start_s`` to ``end_s`` (seconds from the step start)."""

    action: Action
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class BubbleSpan:
    """An idle gap of positive length on one rank."""

    rank: int
    start_s: float
    """seconds from the step start"""
    duration_s: float
    kind: str
    """one of :data:`BUBBLE_KINDS`"""
    before_action_idx: int
    """index of the action that ends the bubble in the rank's order; ``len(order)`` for end-of-step"""
    in_flight_mbs: int
    """microbatches whose activations the rank holds during the bubble"""
    free_bytes: int | None
    """device memory the fill may use during the bubble; ``None`` without a memory model"""

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "start_s": self.start_s,
            "duration_s": self.duration_s,
            "kind": self.kind,
            "free_bytes": self.free_bytes,
            "before_action_idx": self.before_action_idx,
            "in_flight_mbs": self.in_flight_mbs,
        }


@dataclass(frozen=True)
class RankTimeline:
    rank: int
    stages: tuple[int, ...]
    actions: tuple[ActionSpan, ...]
    """in the rank's execution order (same indices as ``Schedule.ranks[rank]``)"""
    busy_s: float
    """compute seconds, step-end work included"""
    bubbles: tuple[BubbleSpan, ...]
    peak_in_flight: int
    """most microbatches holding activations at once on this rank (all its stages together)"""
    peak_used_bytes: int | None
    """most memory the training holds on this rank, bytes; ``None`` without a memory model"""

    @property
    def last_end_s(self) -> float:
        return self.actions[-1].end_s if self.actions else 0.0


@dataclass(frozen=True)
class Timeline:
    """Result of :func:`pipefill.schedules.simulate`."""

    schedule: Schedule
    costs: Costs
    memory: MemoryModel | None
    step_s: float
    """seconds from the step start until every rank has finished its actions and its step-end work"""
    ranks: tuple[RankTimeline, ...]

    def bubbles(self, rank: int) -> list[BubbleSpan]:
        return list(self.ranks[rank].bubbles)

    def idle_s(self, rank: int) -> float:
        return sum(b.duration_s for b in self.ranks[rank].bubbles)

    def bubble_fraction(self, rank: int | None = None) -> float:
        """Idle ÷ step time of ``rank``, or the mean over ranks when ``rank`` is ``None``."""
        if self.step_s <= 0:
            return 0.0
        if rank is not None:
            return self.idle_s(rank) / self.step_s
        return sum(self.idle_s(r) for r in range(len(self.ranks))) / (len(self.ranks) * self.step_s)

    def to_dict(self, *, with_actions: bool = True) -> dict[str, Any]:
        """JSON-ready summary: schedule shape, step time, mean bubble fraction, and per rank its bubbles."""
        s = self.schedule
        ranks: list[dict[str, Any]] = []
        for rt in self.ranks:
            entry: dict[str, Any] = {
                "rank": rt.rank,
                "stages": list(rt.stages),
                "busy_s": rt.busy_s,
                "idle_s": self.idle_s(rt.rank),
                "bubble_fraction": self.bubble_fraction(rt.rank),
                "bubble_count": len(rt.bubbles),
                "peak_in_flight": rt.peak_in_flight,
                "peak_used_bytes": rt.peak_used_bytes,
                "bubbles": [b.to_dict() for b in rt.bubbles],
            }
            if with_actions:
                entry["actions"] = [
                    {"action": str(a.action), "start_s": a.start_s, "end_s": a.end_s} for a in rt.actions
                ]
            ranks.append(entry)
        return {
            "schedule": s.name,
            "ranks_count": s.num_ranks,
            "stages": s.num_stages,
            "virtual_stages": s.virtual_stages,
            "microbatches": s.num_microbatches,
            "placement": s.placement_style,
            "step_s": self.step_s,
            "bubble_fraction": self.bubble_fraction(),
            "ranks": ranks,
        }
