"""The plan at piece granularity (issue #25) on hand-computed cases: the core's :func:`pipefill.plan.plan_pieces`
per bubble class, and the executor's choice of the next step in a bubble (:func:`pipefill_fill.inpieces.next_work`):
the batch in flight first, a whole batch when one fits, else a batch started in pieces."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pipefill.plan import ProfilePoint, plan_pieces
from pipefill_fill.inpieces import FLIGHT_MISSES, Next, PieceCosts, next_work
from pipefill_fill.pieces import Flight
from pipefill_fill.predict import StepModel

MS = 1e-3
# two pieces per batch: 0.2 + 0.2 ms at batch 1, 0.3 + 0.3 at 4, 0.6 + 0.6 at 16, 1.5 + 1.5 at 64
POINTS = [
    ProfilePoint(1, 0.4 * MS, 10, piece_s=(0.2 * MS, 0.2 * MS)),
    ProfilePoint(4, 0.6 * MS, 20, piece_s=(0.3 * MS, 0.3 * MS)),
    ProfilePoint(16, 1.2 * MS, 40, piece_s=(0.6 * MS, 0.6 * MS)),
    ProfilePoint(64, 3.0 * MS, 80, piece_s=(1.5 * MS, 1.5 * MS)),
]


def test_a_class_gets_the_batch_and_pieces_with_the_most_samples_per_bubble() -> None:
    # 1 ms: batch 1 runs 5 pieces (2.5 samples), 4 runs 3 (6), 16 runs 1 (8), 64 none
    plan = plan_pieces(1.0 * MS, POINTS)
    assert plan is not None and (plan.batch_size, plan.pieces, plan.pieces_per_bubble) == (16, 2, 1)
    assert plan.samples_per_bubble == pytest.approx(8.0)
    # 3 ms: 1 → 15 pieces (7.5), 4 → 10 (20), 16 → 5 (40), 64 → 2 (64: one whole batch)
    plan = plan_pieces(3.0 * MS, POINTS)
    assert plan is not None and (plan.batch_size, plan.pieces_per_bubble) == (64, 2)
    # 0.35 ms: one piece of batch 4 (2 samples) beats one of batch 1 (half a sample)
    plan = plan_pieces(0.35 * MS, POINTS)
    assert plan is not None and (plan.batch_size, plan.pieces_per_bubble, plan.samples_per_bubble) == (4, 1, 2.0)
    # 0.25 ms: only batch 1's pieces fit, one per bubble
    plan = plan_pieces(0.25 * MS, POINTS)
    assert plan is not None and (plan.batch_size, plan.pieces_per_bubble, plan.samples_per_bubble) == (1, 1, 0.5)


def test_the_guard_the_wake_up_and_memory_come_off_the_class() -> None:
    plan = plan_pieces(1.3 * MS, POINTS, guard_s=0.2 * MS, switch_s=0.1 * MS)  # 1 ms usable, as above
    assert plan is not None and plan.batch_size == 16
    plan = plan_pieces(1.0 * MS, POINTS, free_bytes=30)  # batch 16 needs 40 bytes: batch 4, 3 pieces
    assert plan is not None and (plan.batch_size, plan.pieces_per_bubble) == (4, 3)
    assert plan_pieces(0.15 * MS, POINTS) is None  # no piece fits
    whole = [ProfilePoint(8, 0.5 * MS, 0)]  # no pieces: one piece of the whole step
    plan = plan_pieces(1.2 * MS, whole)
    assert plan is not None and (plan.batch_size, plan.pieces, plan.pieces_per_bubble) == (8, 1, 2)


def _task(flight: Flight | None = None) -> Any:
    task = SimpleNamespace(flight_misses=0, dropped=0)
    task.in_flight = lambda: task.flight
    task.flight = flight

    def drop() -> None:
        task.dropped += 1
        task.flight = None

    task.pieces = SimpleNamespace(drop_in_flight=drop)
    return task


def _next(task: Any, left_ms: float, class_ms: float, *, any_size: bool = True, fresh: bool = False) -> Next | None:
    model = StepModel({p.batch_size: p.step_s for p in POINTS}, cold_ratio=1.0)  # nothing measured: the base fits
    return next_work(
        task,
        model,
        PieceCosts(POINTS),
        left_s=left_ms * MS,
        class_s=class_ms * MS,
        max_batch=64,
        any_size=any_size,
        fresh=fresh,
    )


def test_a_whole_batch_when_one_fits_else_a_batch_in_pieces_of_the_planned_size() -> None:
    # any size: batch 10 takes 0.6 + 0.6 × 6/12 = 0.9 ms ≤ 0.92, batch 11 0.95 ms
    assert _next(_task(), 0.92, 20.0) == Next(10)
    assert _next(_task(), 0.92, 20.0, any_size=False) == Next(4)  # profiled sizes only
    # 0.35 ms left of a 1 ms class: no whole batch (0.4 ms at batch 1); the plan says 16, whose first piece (0.6 ms)
    # does not fit what is left; batch 4's (0.3 ms) does: batch 4 is started, its first piece half of its step
    assert _next(_task(), 0.35, 1.0) == Next(4, piece=True, share=0.5)
    assert _next(_task(), 0.25, 1.0) == Next(1, piece=True, share=0.5)
    assert _next(_task(), 0.15, 1.0) is None


def test_the_batch_in_flight_goes_on_first_and_is_dropped_after_the_misses() -> None:
    task = _task(Flight(16, 2, 1, carry=None))
    assert _next(task, 5.0, 20.0) == Next(16, piece=True, share=0.5)  # its second piece, not a whole batch
    assert _next(task, 0.5, 1.0) is None and task.flight_misses == 0  # not fresh: the bubble's tail
    for _ in range(FLIGHT_MISSES - 1):
        assert _next(task, 0.5, 0.5, fresh=True) is None  # its piece (0.6 ms) fits no fresh bubble of 0.5
    assert task.dropped == 0 and task.flight_misses == FLIGHT_MISSES - 1
    # dropped (redone later): a whole batch fits, of 2 (0.4 + 0.2 / 3 ms; 3 would take 0.53)
    assert _next(task, 0.5, 0.5, fresh=True) == Next(2)
    assert task.dropped == 1 and task.flight is None and task.flight_misses == 0


def test_a_batch_started_in_a_long_bubbles_tail_is_planned_for_the_short_bubbles_seen() -> None:
    costs = PieceCosts(POINTS)
    assert costs.planning_class_s(20 * MS) == 20 * MS  # nothing seen yet: this bubble's class
    for duration_ms in (20.0, 1.0) * 5:
        costs.note_class(duration_ms * MS)
    assert costs.planning_class_s(20 * MS) == 1.0 * MS  # its pieces must fit the short ones it will go on in
    assert costs.planning_class_s(0.5 * MS) == 0.5 * MS
    # planned for 1 ms: batch 16 (0.6 ms pieces), not 64 (1.5 ms pieces: no short bubble would advance it)
    planned = plan_pieces(costs.planning_class_s(20 * MS), POINTS)
    unplanned = plan_pieces(20 * MS, POINTS)
    assert planned is not None and unplanned is not None and (planned.batch_size, unplanned.batch_size) == (16, 64)


def test_pieces_that_fit_only_the_long_bubbles_run_in_the_long_bubbles() -> None:
    # one batch size whose pieces (13.4 and 9.2 ms, as measured on a CI machine) fit the 19 ms of the long bubbles
    # but not the 9 ms of the short ones, a third of them: planned for the short ones only, it never ran at all
    costs = PieceCosts([ProfilePoint(64, 22.6 * MS, 80, piece_s=(13.4 * MS, 9.2 * MS))])
    for duration_ms in (19.0, 9.0, 19.0) * 10:
        costs.note_class(duration_ms * MS)
    model = StepModel({64: 22.6 * MS}, cold_ratio=1.0)

    def nxt(left_ms: float, class_ms: float) -> Next | None:
        return next_work(_task(), model, costs, left_s=left_ms * MS, class_s=class_ms * MS, max_batch=64)

    assert nxt(19.0, 19.0) == Next(64, piece=True, share=pytest.approx(13.4 / 22.6))
    assert nxt(9.0, 9.0) is None  # the short bubbles wait: no piece of it fits them
    assert nxt(12.0, 19.0) is None  # nor what is left of a long one, short of the first piece


def test_a_batch_in_flight_waits_for_the_next_long_bubble_when_long_ones_are_rare() -> None:
    # its next piece (0.6 ms) fits only the 1 ms bubbles, one in ten: the short ones (0.5 ms) between them are not
    # misses, so the batch is never dropped (and redone) before the next long bubble
    costs, task = PieceCosts(POINTS), _task(Flight(16, 2, 1, carry=None))
    model = StepModel({p.batch_size: p.step_s for p in POINTS}, cold_ratio=1.0)

    def nxt(class_ms: float) -> Next | None:
        left = class_ms * MS
        return next_work(task, model, costs, left_s=left, class_s=left, max_batch=64, fresh=True)

    assert nxt(1.0) == Next(16, piece=True, share=0.5)
    for _ in range(3 * FLIGHT_MISSES):
        assert nxt(0.5) is None
    assert task.dropped == 0 and task.flight_misses == 0
    assert nxt(1.0) == Next(16, piece=True, share=0.5)


def test_a_piece_that_fits_the_bubbles_but_never_what_their_wake_up_leaves_counts_misses() -> None:
    # every bubble: 1 ms usable, of which 0.55 ms are left when work begins. Its next piece (0.6 ms) fits the former,
    # never the latter: counted against the longest class, no miss was ever counted and the batch waited for ever
    # (sentence-embedding at 10 ms bubbles, bench fill --life)
    costs, task = PieceCosts(POINTS), _task(Flight(16, 2, 1, carry=None))
    model = StepModel({p.batch_size: p.step_s for p in POINTS}, cold_ratio=1.0)
    for _ in range(FLIGHT_MISSES - 1):
        assert next_work(task, model, costs, left_s=0.55 * MS, class_s=1.0 * MS, max_batch=16, fresh=True) is None
    assert task.flight_misses == FLIGHT_MISSES - 1
    assert next_work(task, model, costs, left_s=0.55 * MS, class_s=1.0 * MS, max_batch=16, fresh=True) == Next(3)
    assert task.dropped == 1  # dropped and redone, with a batch that fits what is left


# sentence-embedding's batch 1 as profiled on this machine (six layer pieces, 23 ms), and its first five pieces as
# they took in steady work, in 10 ms bubbles (bench fill --life): the profile times each piece a few times, cold
PROFILED_MS = (4.67, 2.49, 2.55, 2.96, 3.02, 7.31)
STEADY_MS = (4.8, 3.0, 3.4, 3.0, 3.6)


def test_piece_shares_follow_the_measured_pieces_and_the_last_one_fits_again() -> None:
    """The executor's loop over a batch in flight: each piece predicted at its share of the step model's base, run,
    recorded by the model (as the step it is that share of) and by the piece costs. The last piece is never run: it
    does not fit. With the profile's shares the pieces' ratios spread (1.0-1.3), the base is re-anchored on their
    median and at the model's high quantile the last piece (7.3 ms profiled) takes more than the 9.3 ms a 10 ms
    bubble leaves: the batch was dropped and redone for ever. With the measured shares of the first five (the last
    one scaled as they are) it fits."""

    def steady(learn: bool) -> Next | None:
        points = [ProfilePoint(1, sum(PROFILED_MS) * MS, 0, piece_s=tuple(t * MS for t in PROFILED_MS))]
        costs, model = PieceCosts(points), StepModel({1: sum(PROFILED_MS) * MS})
        for _ in range(10):
            for index, took_ms in enumerate(STEADY_MS):
                model.record(1, took_ms * MS / costs.share(1, index, 6))
                if learn:
                    costs.observe(1, index, 6, took_ms * MS)
        task = _task(Flight(1, 6, 5, carry=None))
        return next_work(task, model, costs, left_s=9.3 * MS, class_s=9.5 * MS, max_batch=1, fresh=True)

    assert steady(learn=False) is None
    nxt = steady(learn=True)
    scaled = PROFILED_MS[-1] * sum(STEADY_MS) / sum(PROFILED_MS[:-1])  # the last piece, scaled as the others
    assert nxt is not None and nxt.piece and nxt.share == pytest.approx(scaled / (sum(STEADY_MS) + scaled))


def test_the_planned_points_follow_the_model_the_shares_and_the_batch_limit() -> None:
    """The points planned with are computed once per state (they are asked for at every piece): a re-anchored step
    model, a piece's measured times and another batch limit each give new ones."""
    costs = PieceCosts(POINTS)
    model = StepModel({p.batch_size: p.step_s for p in POINTS}, cold_ratio=1.0)
    first = costs.plan_points(model, 64)
    assert costs.plan_points(model, 64) is first and [p.step_s for p in first] == [p.step_s for p in POINTS]
    assert [p.batch_size for p in costs.plan_points(model, 4)] == [1, 4]
    assert costs.plan_points(model, 64)[0].step_s == pytest.approx(0.4 * MS)
    for _ in range(16):  # batch 1 twice as slow as profiled: its anchor (and the pooled ones above) move
        model.record(1, 0.8 * MS)
    slower = costs.plan_points(model, 64)
    assert slower[0].step_s == pytest.approx(0.8 * MS) and slower[0].piece_s == pytest.approx((0.4 * MS, 0.4 * MS))
    for _ in range(3):  # batch 1's first piece measured at three times its second
        costs.observe(1, 0, 2, 0.6 * MS)
        costs.observe(1, 1, 2, 0.2 * MS)
    shared = costs.plan_points(model, 64)
    assert shared[0].piece_s == pytest.approx((0.6 * MS, 0.2 * MS))
    assert costs.share(1, 0, 2) == pytest.approx(0.75) and costs.share(2, 0, 2) == pytest.approx(0.75)
