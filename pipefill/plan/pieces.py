"""The plan at piece granularity (issue #25): for a bubble class, the batch size and pieces per bubble of a workload
whose steps run in pieces (a layer, or a block of layers, of one batch at a time; the batch in flight stays on the
device between bubbles and goes on in the next).

In a bubble of usable length ``d`` (its length less the guard and the wake-up), a batch of size ``b`` whose ``n``
pieces take at most ``p_max`` each advances by ``k = floor(d / p_max)`` pieces whatever piece it is at, so
``b × k ÷ n`` samples per bubble (``k ≥ n``: whole batches, ``k ÷ n`` of them). The plan is the batch size with the
most samples per bubble (ties: the smaller batch, less in flight) among those whose peak memory fits. A step that is
not cut into pieces is one piece of its whole length, so a workload without partial steps is planned as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from pipefill.plan.planner import ProfilePoint

__all__ = ["PiecePlan", "pieces_of", "plan_pieces"]

_EPS = 1e-9  # floor(0.3 / 0.1) must be 3


@dataclass(frozen=True)
class PiecePlan:
    """A bubble class's plan: ``batch_size`` run ``pieces_per_bubble`` pieces at a time out of its ``pieces``."""

    batch_size: int
    pieces: int
    pieces_per_bubble: int
    samples_per_bubble: float


def pieces_of(point: ProfilePoint) -> tuple[float, ...]:
    """The piece times of ``point``: its measured pieces, else one piece of the whole step."""
    return point.piece_s or (point.step_s,)


def plan_pieces(
    duration_s: float,
    points: Iterable[ProfilePoint],
    *,
    guard_s: float = 0.0,
    switch_s: float = 0.0,
    free_bytes: int | None = None,
) -> PiecePlan | None:
    """The batch size and pieces per bubble with the most samples per bubble of ``duration_s`` (see the module
    docstring); None when no piece of any batch size that fits ``free_bytes`` fits the bubble."""
    usable = duration_s - guard_s - switch_s
    best: PiecePlan | None = None
    for p in sorted(points, key=lambda q: q.batch_size):
        if free_bytes is not None and p.peak_bytes > free_bytes:
            continue
        pieces = pieces_of(p)
        longest = max(pieces)
        k = math.floor(usable / longest + _EPS) if longest > 0 else len(pieces)
        if k < 1:
            continue
        samples = p.items * k / len(pieces)
        if best is None or samples > best.samples_per_bubble + _EPS:
            best = PiecePlan(p.batch_size, len(pieces), k, samples)
    return best
