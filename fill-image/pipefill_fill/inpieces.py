"""Inside a bubble, the next step of a job whose workload runs its steps in pieces (issue #25, partial steps;
:mod:`pipefill_fill.pieces`): the next piece of the batch in flight when it fits the time left; else a whole batch
sized to the time left, as for any workload; else — no whole batch fits — a new batch started in pieces, of the size
the plan at piece granularity gives this bubble's class or the short bubbles of the last ones, the shorter
(:func:`pipefill.plan.plan_pieces`, on the step times the step model has learnt; :meth:`PieceCosts.planning_class_s`)
— this bubble's class when no piece fits the short ones —, or smaller when its first piece does not fit what is left.

A piece is predicted as its share of its batch's step (the profile's piece times) times the step model's base, and
fits by the step's rule (expected overrun within the budget). A batch in flight whose next piece fits no fresh bubble
for :data:`FLIGHT_MISSES` bubbles in a row, none of the last bubbles long enough for it either, is dropped: nothing of
it was committed, and it is redone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from pipefill.plan import ProfilePoint, plan_pieces
from pipefill_fill.predict import OVERRUN_BUDGET_S, StepModel
from pipefill_fill.task import FillTask

__all__ = ["FLIGHT_MISSES", "SHARE_WARM", "SPLIT_TAIL", "Next", "PieceCosts", "continue_work", "next_work"]

FLIGHT_MISSES = 8
"""Fresh bubbles in a row the next piece of a batch in flight may not fit (nor any of the last bubbles' lengths)
before the batch is dropped."""

SPLIT_TAIL = 2.0
"""A step longer than the split (``split_above_s``) runs in pieces only where the time left is less than this many
times its prediction: the bubble's last steps, which a slow spell would carry past the deadline. The steps before
them run whole: each piece costs the executor's own work between pieces (about 0.2 ms on the development VM), and
with every long step split the classifier's four pieces cost a tenth of its recovery at 50 ms bubbles (0.76 against
0.85)."""

SHARE_WARM = 3
"""Measured times of each piece of a batch size before its shares are the measured ones instead of the profile's."""
SHARE_WINDOW = 16
"""Each piece's recent times kept: its share follows the median of these."""


@dataclass(frozen=True)
class Next:
    """The next step: ``batch_size``, whether it is a piece, and its share of its batch's step (1 for a whole one)."""

    batch_size: int
    piece: bool = False
    share: float = 1.0


class PieceCosts:
    """The pieces of each profiled batch size as shares of its step (from the profile's piece times)."""

    def __init__(self, points: Sequence[ProfilePoint]) -> None:
        self.points = sorted((p for p in points if p.piece_s and sum(p.piece_s) > 0), key=lambda p: p.batch_size)
        self._profiled = {p.batch_size: p.piece_s for p in self.points}
        self._shares = {p.batch_size: tuple(t / sum(p.piece_s) for t in p.piece_s) for p in self.points}
        self._classes: deque[float] = deque(maxlen=64)  # usable lengths of the last bubbles
        self._measured: dict[int, list[deque[float]]] = {}  # per profiled size, per piece: its recent times
        self._medians: dict[int, dict[int, float]] = {}  # per profiled size, per warm piece: the median of its times
        self._near: dict[tuple[int, int], int | None] = {}  # (batch size, pieces) → the nearest profiled size
        self._version = 0  # moves on whenever a share changes
        self._planned: tuple[object, ...] = ()
        self._plan_points: list[ProfilePoint] = []

    def observe(self, batch_size: int, index: int, pieces: int, cost_s: float) -> None:
        """Piece ``index`` of ``pieces`` of a batch of ``batch_size`` took ``cost_s``. The shares of the nearest
        profiled size follow the measured pieces: each piece with :data:`SHARE_WARM` recent times counts as their
        median, each other one as its profiled time scaled by the measured ÷ profiled of those (the profile times
        each piece a few times, cold, in one bubble: in steady work a sentence encoder's profiled 7.0 ms piece of
        27.2 took 4 ms, its pieces' ratios to their profiled shares spread from 0.6 to 1.3, and at the step model's
        high quantile of that spread its last piece fitted no bubble: the batch was dropped and redone for ever).
        Runs after every piece: only the piece's own median is computed again."""
        near = self._nearest(batch_size, pieces)
        if near is None or not 0 <= index < pieces:
            return
        times = self._measured.get(near)
        if times is None:
            times = self._measured[near] = [deque(maxlen=SHARE_WINDOW) for _ in range(pieces)]
        recent = times[index]
        recent.append(cost_s)
        if len(recent) < SHARE_WARM:
            return
        known = self._medians.setdefault(near, {})
        ordered = sorted(recent)
        half = len(ordered) // 2
        known[index] = ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2
        profiled = self._profiled[near]
        if (base := sum(profiled[i] for i in known)) <= 0:
            return
        scale = sum(known.values()) / base
        estimates = [known.get(i, profiled[i] * scale) for i in range(pieces)]
        total = sum(estimates)
        self._shares[near] = tuple(e / total for e in estimates)
        self._version += 1

    def note_class(self, class_s: float) -> None:
        """A bubble of usable length ``class_s`` began."""
        self._classes.append(class_s)

    def planning_class_s(self, class_s: float) -> float:
        """The bubble length a batch started now is planned for: this bubble's, or — shorter — the 10th percentile of
        the last bubbles' (a batch started in a long bubble's tail goes on in the next bubbles; sized for the long
        ones, its pieces would fit no short bubble, which would then wait for the next long one: measured in
        tests/fill/test_fill_pieces.py, bubbles of 30 and 2.5 ms)."""
        if not self._classes:
            return class_s
        ordered = sorted(self._classes)
        return min(class_s, ordered[len(ordered) // 10])

    def longest_class_s(self) -> float:
        """The longest usable length of the last bubbles (0.0 before any): a batch in flight whose next piece fits
        one of those waits for the next such bubble instead of counting a miss (long bubbles may come one in ten)."""
        return max(self._classes, default=0.0)

    def __bool__(self) -> bool:
        return bool(self.points)

    def share(self, batch_size: int, index: int, pieces: int) -> float:
        """Piece ``index`` of ``pieces`` of a batch of ``batch_size``: the nearest profiled size's share (equal
        shares when no profiled size has that many pieces)."""
        best = self._nearest(batch_size, pieces)
        if best is None or not 0 <= index < pieces:
            return 1.0 / max(1, pieces)
        return self._shares[best][index]

    def _nearest(self, batch_size: int, pieces: int) -> int | None:
        """The profiled size nearest ``batch_size`` whose steps come in ``pieces`` pieces (None: none)."""
        key = (batch_size, pieces)
        if key not in self._near:  # the profiled sizes and their piece counts never change: looked up once
            near = [b for b, s in self._shares.items() if len(s) == pieces]
            self._near[key] = min(near, key=lambda b: (abs(b - batch_size), b)) if near else None
        return self._near[key]

    def plan_points(self, model: StepModel, max_batch: int) -> list[ProfilePoint]:
        """The profiled points up to ``max_batch`` with the model's step times (its base: the profile corrected by
        the steps run since) and their pieces scaled to them. Computed again only when the model's times, the shares or
        ``max_batch`` changed: the list is shared between calls, not to be changed."""
        key = (model, max_batch, self._version, *model.times)
        if key == self._planned:
            return self._plan_points
        out = []
        for p in self.points:
            if p.batch_size > max_batch:
                continue
            step_s = model.base_s(p.batch_size)
            pieces = tuple(step_s * s for s in self._shares[p.batch_size])
            out.append(ProfilePoint(p.batch_size, step_s, p.peak_bytes, p.items_per_step, piece_s=pieces))
        self._planned, self._plan_points = key, out
        return out


def next_work(
    task: FillTask,
    model: StepModel,
    costs: PieceCosts | None,
    *,
    left_s: float,
    class_s: float,
    max_batch: int,
    kind: str = "",
    any_size: bool = True,
    budget_s: float = OVERRUN_BUDGET_S,
    fresh: bool = False,
    split_above_s: float = 0.0,
) -> Next | None:
    """The next step that fits ``left_s`` (None: none); ``class_s``: the usable length of this bubble (its class);
    ``fresh``: nothing ran in the bubble yet (a piece in flight that does not fit counts as a miss). A whole step
    that fits, is predicted longer than ``split_above_s`` (> 0) and would pass the deadline at :data:`SPLIT_TAIL`
    times its prediction starts in pieces: each of the next ones runs only while it fits what is left, so a step that
    runs slow stops at a piece boundary."""
    if fresh and costs:  # what a bubble of this class leaves when work begins (after the wake-up and settling)
        costs.note_class(min(class_s, left_s))
    flight = task.in_flight() if costs else None
    if flight is not None and costs is not None:
        share = costs.share(flight.batch_size, flight.done, flight.pieces)
        piece_s = model.base_s(flight.batch_size) * share
        if model.fits(piece_s, left_s, kind, budget_s=budget_s):
            task.flight_misses = 0
            return Next(flight.batch_size, piece=True, share=share)
        if not fresh or model.fits(piece_s, costs.longest_class_s(), kind, budget_s=budget_s):
            return None  # the bubble's tail, or a bubble shorter than one of the last ones that holds the piece
        task.flight_misses += 1
        if task.flight_misses < FLIGHT_MISSES or task.pieces is None:
            return None
        task.pieces.drop_in_flight()  # nothing of it was committed: it is redone from the position it started at
        task.flight_misses = 0
    size = model.largest_fitting(left_s, max_batch, kind, any_size=any_size, budget_s=budget_s)
    if size is not None:
        predicted_s = model.predict_s(size, kind) if split_above_s > 0 else 0.0
        if predicted_s > split_above_s and left_s < SPLIT_TAIL * predicted_s and costs and task.pieces is not None:
            pieces = task.pieces.pieces(size)
            if pieces > 1:
                return Next(size, piece=True, share=costs.share(size, 0, pieces))
        return Next(size)
    if not costs or task.pieces is None:
        return None
    points = costs.plan_points(model, max_batch)
    # planned for the short bubbles seen; when no piece fits those, for this bubble's own class: the batch then goes
    # on in the long bubbles only (without this, a job whose pieces fit only the long bubbles never ran at all)
    plan = plan_pieces(costs.planning_class_s(class_s), points) or plan_pieces(class_s, points)
    if plan is None:
        return None
    for p in reversed(points):  # the planned size, or the largest smaller one whose first piece fits what is left
        if p.batch_size > plan.batch_size:
            continue
        share = costs.share(p.batch_size, 0, len(p.piece_s))
        if model.fits(p.step_s * share, left_s, kind, budget_s=budget_s):
            return Next(p.batch_size, piece=True, share=share)
    return None


def continue_work(
    task: FillTask, model: StepModel, costs: PieceCosts | None, *, max_piece_s: float, max_batch: int, kind: str = ""
) -> Next | None:
    """After the planned end, while the bubble is still open (issue #25 item 3): the next piece of the batch in
    flight when it is predicted (the step model's high quantile) to take at most ``max_piece_s``; with none in
    flight, the first piece of a new batch — the largest profiled size whose every piece is. None: nothing that
    short."""
    if not costs or task.pieces is None:
        return None
    factor = model.factor(kind)
    flight = task.in_flight()
    if flight is not None:
        share = costs.share(flight.batch_size, flight.done, flight.pieces)
        short = model.base_s(flight.batch_size) * share * factor <= max_piece_s
        return Next(flight.batch_size, piece=True, share=share) if short else None
    for p in reversed(costs.plan_points(model, max_batch)):
        if max(p.piece_s) * factor <= max_piece_s:
            return Next(p.batch_size, piece=True, share=costs.share(p.batch_size, 0, len(p.piece_s)))
    return None
