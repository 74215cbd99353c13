"""What an executor reports about its rank (pipefill_fill.unfit): the unfit reasons with their numbers, and the bubble
classes, from profiler results and observed bubbles (plain values: the functions are pure)."""

from __future__ import annotations

from dataclasses import dataclass

from pipefill.plan import ObservedBubble
from pipefill.queue import Identity
from pipefill.spec.fillstatus import UnfitReason
from pipefill_fill.unfit import bubble_classes, unfit_report

ME = Identity("gpt", 1)


@dataclass
class _Profiled:  # what the profiler leaves behind (stopped_by, the last candidate's measurements)
    stopped_by: str = ""
    last_step_s: float | None = None
    last_peak_bytes: int | None = None


@dataclass
class _Point:
    step_s: float
    peak_bytes: int


BUBBLES = [
    ObservedBubble(0.004, 1 << 30, "F"),
    ObservedBubble(0.012, 1 << 30, "B"),
    ObservedBubble(0.004, 1 << 30, "F"),
]
SEEN = BUBBLES * 6  # more than MIN_BUBBLES_SEEN


def test_no_bubble_long_enough_names_the_step_and_the_bubble() -> None:
    report = unfit_report(_Profiled(), [_Point(0.020, 1 << 20)], SEEN, identity=ME, free_bytes=1 << 30, guard_s=0.001)
    assert report is not None and report.reason == UnfitReason.BUBBLE_TOO_SHORT
    assert (report.training_job, report.rank) == ("gpt", 1)
    assert report.step_milliseconds == 20.0 and report.longest_bubble_milliseconds == 11.0
    assert report.message == (
        "no bubble long enough: the shortest step takes 20.000 ms, this rank's longest usable bubble is 11.000 ms"
    )
    fits = unfit_report(_Profiled(), [_Point(0.010, 1 << 20)], SEEN, identity=ME, free_bytes=1 << 30, guard_s=0.001)
    assert fits is None
    early = unfit_report(_Profiled(), [_Point(0.020, 1)], BUBBLES, identity=ME, free_bytes=1 << 30, guard_s=0.001)
    assert early is None  # three bubbles seen: too few to send the job away
    assert unfit_report(_Profiled(), [_Point(0.5, 1)], [], identity=ME, free_bytes=1, guard_s=0.0) is None  # no data


@dataclass
class _Pieces:
    step_s: float
    peak_bytes: int
    piece_s: tuple[float, ...]


def test_one_bubble_that_ran_long_does_not_make_a_job_fit_but_long_bubbles_one_in_ten_do() -> None:
    """sentence-embedding on 10 ms bubbles: its longest piece (10.5 ms) fits none, but one bubble of 64 ran to
    14.9 ms; by the longest bubble it "fit", and the planner (which plans for the announced 10 ms) never ran it."""
    job = [_Pieces(0.0395, 1, (0.007, 0.0094, 0.0105, 0.0079, 0.0066, 0.0061))]
    tens = [ObservedBubble(0.010, 1 << 30, "F")] * 63
    report = unfit_report(
        _Profiled(), job, [*tens, ObservedBubble(0.0149, 1 << 30, "F")], identity=ME, free_bytes=1 << 30, guard_s=5e-4
    )
    assert report is not None and report.reason == UnfitReason.BUBBLE_TOO_SHORT
    assert report.step_milliseconds == 10.5 and report.longest_bubble_milliseconds == 9.5
    one_in_ten = [*tens[:57], *[ObservedBubble(0.020, 1 << 30, "B")] * 7]  # long ones the planner plans for too
    assert unfit_report(_Profiled(), job, one_in_ten, identity=ME, free_bytes=1 << 30, guard_s=5e-4) is None


def test_not_enough_memory_names_both_sizes() -> None:
    over = _Profiled(stopped_by="memory", last_step_s=0.001, last_peak_bytes=3 << 30)
    report = unfit_report(over, [], BUBBLES, identity=ME, free_bytes=2 << 30, guard_s=0.001)
    assert report is not None and report.reason == UnfitReason.NOT_ENOUGH_MEMORY
    assert report.peak_memory_bytes == 3 << 30 and report.free_bytes == 2 << 30
    assert "the smallest batch needs 3221225472 bytes (3072.0 MiB)" in report.message
    assert "may use 2147483648 bytes (2048.0 MiB)" in report.message


def test_a_profile_its_slice_ended_before_any_size_was_measured_is_no_verdict() -> None:
    ran_out = _Profiled(stopped_by="work")  # the slice had no work left to measure with
    assert unfit_report(ran_out, [], SEEN, identity=ME, free_bytes=1 << 30, guard_s=0.001) is None
    nothing = _Profiled()  # the same without a reason: the smallest batch did not fit
    assert unfit_report(nothing, [], SEEN, identity=ME, free_bytes=1 << 30, guard_s=0.001) is not None


def test_bubble_classes_per_step() -> None:
    got = bubble_classes(BUBBLES * 5, identity=ME, free_bytes=1 << 29)
    assert got is not None and (got.training_job, got.rank) == ("gpt", 1)
    assert [(c.duration_milliseconds, c.per_step, c.free_bytes) for c in got.classes] == [
        (12.0, 0.5, 1 << 29),  # one B bubble for every two F bubbles: half a class per step of the most frequent kind
        (4.0, 1.0, 1 << 29),
    ]
    assert bubble_classes([], identity=ME, free_bytes=1) is None
