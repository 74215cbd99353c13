"""The fill projected in pieces (issue #25): a batch in flight carried between a rank's bubbles and across steps."""

from __future__ import annotations

import random

import pytest

from pipefill.plan import ProfilePoint
from pipefill.schedules import BubbleSpan, Costs, FillProfile, build_schedule, project_fill, simulate
from pipefill.schedules.fill_pieces import fill_rank_in_pieces


def bubble(start: float, duration: float, free: int | None = None) -> BubbleSpan:
    return BubbleSpan(0, start, duration, "steady", 0, 0, free)


def test_equal_pieces_fill_each_bubble_up_to_the_guard() -> None:
    point = ProfilePoint(2, 1.0, 0, piece_s=(0.25,) * 4)
    fills = fill_rank_in_pieces([bubble(0, 0.5), bubble(1, 1.2), bubble(3, 0.2)], [point], guard_s=0.1, switch_s=0)
    assert [f.pieces for f in fills] == [1, 4, 0]  # 0.4 usable: one piece; 1.1: four; 0.1: none
    assert [f.filled_s for f in fills] == [0.25, 1.0, 0.0]
    assert [f.samples for f in fills] == [0.5, 2.0, 0.0]  # a batch of 2 in 4 pieces: half a sample a piece
    assert fills[2].batch_size is None and "shorter than any piece of batch 2 (250 ms)" in fills[2].reason


def test_the_batch_in_flight_goes_on_in_the_next_step() -> None:
    # one 0.35 s bubble a step, pieces of 0.3 and 0.1: the 0.3 piece fits, the 0.1 after it does not (0.05 left);
    # the next step starts with that 0.1 piece, and the 0.3 after it does not fit (0.25 left)
    point = ProfilePoint(1, 0.4, 0, piece_s=(0.3, 0.1))
    (fill,) = fill_rank_in_pieces([bubble(0, 0.35)], [point], guard_s=0, switch_s=0)
    assert fill.pieces == pytest.approx(1.0)  # one piece a step, the mean over the 2 steps of the cycle
    assert fill.filled_s == pytest.approx(0.2)
    assert fill.samples == pytest.approx(0.5)


def naive(bubbles: list[BubbleSpan], pieces: tuple[float, ...], guard: float, steps: int) -> list[float]:
    """Piece by piece, no shortcut: seconds filled per bubble over ``steps`` steps."""
    busy, pos = [0.0] * len(bubbles), 0
    for _ in range(steps):
        for i, b in enumerate(bubbles):
            left = b.duration_s - guard
            while pieces[pos] <= left + 1e-12:
                left -= pieces[pos]
                busy[i] += pieces[pos]
                pos = (pos + 1) % len(pieces)
    return [t / steps for t in busy]


@pytest.mark.parametrize("seed", range(20))
def test_whole_batches_at_once_match_piece_by_piece(seed: int) -> None:
    rng = random.Random(seed)
    pieces = tuple(round(rng.uniform(0.05, 1.0), 3) for _ in range(rng.randint(2, 7)))
    bubbles = [bubble(i, round(rng.uniform(0.0, 8.0), 3)) for i in range(rng.randint(1, 9))]
    point = ProfilePoint(3, sum(pieces), 0, piece_s=pieces)
    fills = fill_rank_in_pieces(bubbles, [point], guard_s=0.1, switch_s=0)
    assert [f.filled_s for f in fills] == pytest.approx(naive(bubbles, pieces, 0.1, len(pieces)))


def test_a_rank_runs_the_batch_size_that_does_most_and_fits_its_least_free_memory() -> None:
    small = ProfilePoint(1, 0.4, 100, piece_s=(0.1,) * 4)
    large = ProfilePoint(8, 1.6, 500, piece_s=(0.4,) * 4)  # twice the samples per second
    bubbles = [bubble(0, 2.0, free=1000), bubble(3, 0.3, free=1000)]
    # 5 pieces of 8 (10 samples) beat 20 + 3 pieces of 1 (5.75), though the short bubble then stays empty
    assert [f.batch_size for f in fill_rank_in_pieces(bubbles, [small, large], guard_s=0, switch_s=0)] == [8, None]
    # the large batch fits the long bubble's memory but not the short one's, where it would wait in flight
    tight = [bubble(0, 2.0, free=1000), bubble(3, 0.3, free=400)]
    fills = fill_rank_in_pieces(tight, [small, large], guard_s=0, switch_s=0)
    assert [f.batch_size for f in fills] == [1, 1]
    (none,) = fill_rank_in_pieces([bubble(0, 2.0, free=50)], [small, large], guard_s=0, switch_s=0)
    assert none.batch_size is None and "least free memory in a bubble (50 bytes)" in none.reason


def test_pieces_fill_more_of_1f1b_than_whole_steps() -> None:
    timeline = simulate(build_schedule("1f1b", ranks=4, microbatches=8), Costs.uniform())
    batches = [{"batch_size": 1, "step_s": 1.5, "peak_bytes": 0}, {"batch_size": 4, "step_s": 4.0, "peak_bytes": 0}]
    whole = project_fill(timeline, FillProfile.from_json({"batches": batches}))
    assert whole.steps == "whole"  # no pieces in the profile
    pieced = FillProfile.from_json({"batches": [{**b, "pieces": 3} for b in batches]})
    pieces = project_fill(timeline, pieced)
    assert pieces.steps == "pieces" and project_fill(timeline, pieced, steps="whole").bubble_use == whole.bubble_use
    # the 1-unit waits hold no whole step of 1.5 but two pieces of 0.5
    assert whole.bubble_use < pieces.bubble_use <= 1.0
    assert pieces.samples_per_step == pytest.approx(sum(f.samples for rank in pieces.plans for f in rank))
    with pytest.raises(ValueError, match=r"fill steps 'pieces': the fill profile 'fill' has no piece times"):
        project_fill(timeline, FillProfile.from_json({"batches": batches}), steps="pieces")
    with pytest.raises(ValueError, match=r"fill steps 'half': must be one of whole, pieces"):
        project_fill(timeline, pieced, steps="half")


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({"pieces": 0}, r"batches\[0\] needs .*pieces must be a whole number >= 1, got 0"),
        ({"pieces": 2.5}, r"pieces must be a whole number >= 1, got 2.5"),
        ({"pieces": 2, "piece_s": [0.1, 0.1]}, r"give piece_s or pieces, not both"),
        ({"piece_s": [0.1, -0.1]}, r"piece_s: \(0.1, -0.1\) must be ≥ 0 seconds each"),
        ({"piece_s": "fast"}, r"batches\[0\] needs batch_size, step_s and peak_bytes"),
        ({"piece_s": [0.0, 0.0]}, r"piece_s \[0.0, 0.0\] must add up to more than 0 seconds"),
    ],
)
def test_bad_pieces_name_the_batch_and_the_rule(batch: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FillProfile.from_json({"batches": [{"batch_size": 1, "step_s": 0.2, "peak_bytes": 0, **batch}]})
