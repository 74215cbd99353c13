"""A rank's bubbles filled in pieces (issue #25's partial steps), as the fill executor runs them.

The rank runs one batch size. In each bubble, after the ``switch_s`` wake-up, it runs the pieces of the batch in
flight in order (then of the next batch) while the next piece ends ``guard_s`` before the bubble does; the batch in
flight stays on the device until the rank's next bubble, across the step's end. So its memory must fit the *least*
free memory of all the rank's bubbles, and the position in the batch at a step's start depends on the steps before:
with pieces of unequal length the figures are the mean over as many consecutive steps as the batch has pieces (at
most :data:`STEADY_STEPS`), a steady state. The batch size is the one with the most samples per step (ties: the
smaller, less in flight), which is the planner's choice (:func:`pipefill.plan.plan_pieces`) over the whole step
rather than per bubble class. A step that is not cut into pieces is one piece of its whole length.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipefill.plan import ProfilePoint
from pipefill.plan.pieces import pieces_of
from pipefill.schedules.timeline import BubbleSpan

__all__ = ["STEADY_STEPS", "BubbleFill", "fill_rank_in_pieces"]

STEADY_STEPS = 64
"""the most consecutive steps a steady state is averaged over"""
_EPS = 1e-12


@dataclass(frozen=True)
class BubbleFill:
    """What one bubble of the timeline runs, per training step (in pieces: the mean over the steps of a steady
    state, so ``samples`` and ``pieces`` may be fractions); ``batch_size`` None: the bubble stays empty, see
    ``reason``."""

    bubble: BubbleSpan
    batch_size: int | None
    filled_s: float
    samples: float
    pieces: float = 0.0
    """pieces run (0 where whole steps are planned)"""
    reason: str = ""


def fill_rank_in_pieces(
    bubbles: Sequence[BubbleSpan], points: Iterable[ProfilePoint], *, guard_s: float, switch_s: float
) -> tuple[BubbleFill, ...]:
    """One rank's bubbles (in time order) filled in pieces by the batch size that does the most samples per step."""
    frees = [b.free_bytes for b in bubbles if b.free_bytes is not None]
    least_free = min(frees) if frees else None
    best: tuple[BubbleFill, ...] | None = None
    best_samples = -1.0
    for point in sorted(points, key=lambda p: p.batch_size):
        if least_free is not None and point.peak_bytes > least_free:
            continue
        fills = _run(bubbles, point, guard_s, switch_s)
        samples = sum(f.samples for f in fills)
        if samples > best_samples + 1e-9:
            best, best_samples = fills, samples
    if best is None:
        why = (
            f"no batch size's peak memory fits the rank's least free memory in a bubble ({least_free} bytes), "
            "which a batch in flight holds between bubbles"
        )
        return tuple(BubbleFill(b, None, 0.0, 0.0, reason=why) for b in bubbles)
    return best


def _run(bubbles: Sequence[BubbleSpan], point: ProfilePoint, guard_s: float, switch_s: float) -> tuple[BubbleFill, ...]:
    pieces = pieces_of(point)
    n, cycle = len(pieces), sum(pieces)
    if not cycle > 0:
        raise ValueError(f"batch {point.batch_size}: its pieces {list(pieces)} must add up to more than 0 seconds")
    steps = 1 if max(pieces) - min(pieces) <= _EPS else min(n, STEADY_STEPS)
    done = [0] * len(bubbles)
    busy = [0.0] * len(bubbles)
    pos = 0
    for _ in range(steps):  # equal pieces: where the batch stands does not matter, one step is the steady state
        for i, bubble in enumerate(bubbles):
            left = bubble.duration_s - guard_s - switch_s
            if left >= cycle:  # whole batches from wherever it stands: n pieces that sum to cycle
                rounds = math.floor(left / cycle + 1e-9)
                done[i] += rounds * n
                busy[i] += rounds * cycle
                left -= rounds * cycle
            while pieces[pos] <= left + _EPS:
                left -= pieces[pos]
                busy[i] += pieces[pos]
                done[i] += 1
                pos = (pos + 1) % n
    shortest = min(pieces)
    out = []
    for i, bubble in enumerate(bubbles):
        if done[i] == 0:
            usable_ms = max(0.0, bubble.duration_s - guard_s - switch_s) * 1e3
            why = (
                f"{usable_ms:.3g} ms left after the guard and the switch is shorter than any piece of batch "
                f"{point.batch_size} ({shortest * 1e3:.3g} ms)"
            )
            out.append(BubbleFill(bubble, None, 0.0, 0.0, reason=why))
            continue
        out.append(
            BubbleFill(bubble, point.batch_size, busy[i] / steps, point.items * done[i] / n / steps, done[i] / steps)
        )
    return tuple(out)
