"""Profiling inside bubbles holds to the bubble's end (issue #31: the demo's overrun warnings came from profiling
steps): a measurement starts only where a conservative bound on it fits (the slowest step of its size measured so far,
with a margin and the measurement's own overhead), and a profile completed in a bubble is written to the cache after
it, not inside it. A real encoder job; each step's cost is set by a fake clock, so the checks hold under any load."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from commit_helpers import CPU, PARAMS, Bubble, open_task
from fill_helpers import write_job

from pipefill_fill.inprofile import PROFILE_MISSES, due_between, run_profile_steps
from pipefill_fill.profiler import PROFILE_BOUND, BubbleProfiler
from pipefill_fill.task import FillTask

MS = 1_000_000


class _Clock:
    """A clock that moves only when a step runs (by the step's scripted cost)."""

    def __init__(self) -> None:
        self.ns = 10**12

    def __call__(self) -> int:
        return self.ns


def _scripted(task: FillTask, clock: _Clock, costs_ms: Iterator[float]) -> None:
    """Every step of ``task``'s workload costs the next of ``costs_ms`` on ``clock``."""
    step = task.workload.step

    def timed(batch_size: int) -> int:
        clock.ns += int(next(costs_ms) * MS)
        return int(step(batch_size))

    task.workload.step = timed  # type: ignore[method-assign]


def _profiler(jobs_dir: Path, clock: _Clock, costs_ms: list[float], *, total: int = 10**5) -> BubbleProfiler:
    task = open_task(write_job(jobs_dir, "enc", total=total, parameters={**PARAMS, "batchSizes": [2, 4]}))
    task.use_pieces = False  # whole steps: one scripted cost each
    _scripted(task, clock, iter(costs_ms))
    profiler = BubbleProfiler(task, CPU, memory_budget_bytes=1 << 30, warmup=1, repeats=5, clock=clock)
    profiler.hints = {2: 0.001, 4: 0.002}
    return profiler


def _bubble(profiler: BubbleProfiler, clock: _Clock, *, left_ms: float) -> int:
    """One bubble of ``left_ms`` from now; returns the measurements run in it."""
    b = Bubble(0, clock.ns, clock.ns + int(left_ms * MS))
    out = run_profile_steps(b, profiler=profiler, is_open=lambda _id: True, deadline_ns=b.expected_end_ns, clock=clock)
    assert all(end <= b.expected_end_ns for _, end in out.spans_ns), "a measurement ran past the bubble's end"
    return out.steps


def test_a_measurement_starts_only_where_its_slowest_size_fits(jobs_dir: Path) -> None:
    clock = _Clock()
    profiler = _profiler(jobs_dir, clock, [1.0, 1.0, 1.0, 4.0] + [1.0] * 100)
    for _ in range(4):
        profiler.measure_one()  # between bubbles: the first step (not counted), then 1, 1 and 4 ms
    assert profiler.predict_s() == 0.001  # the lower median: what a measurement usually takes
    bound = profiler.bound_s()
    assert bound is not None and bound >= PROFILE_BOUND * 0.004  # but one took 4 ms: it may again
    assert _bubble(profiler, clock, left_ms=3.0) == 0  # fits by the median (1 ms), not by the bound
    assert _bubble(profiler, clock, left_ms=1e3 * bound) == 1


def test_a_profile_completed_in_a_bubble_is_cached_after_it(jobs_dir: Path, profile_cache: Path) -> None:
    clock = _Clock()
    profiler = _profiler(jobs_dir, clock, [1.0] * 100)
    assert _bubble(profiler, clock, left_ms=100.0) == 12  # 6 measurements (1 warm-up + 5) of each size
    assert profiler.result is not None and [p.batch_size for p in profiler.result.points] == [2, 4]
    assert not list(profile_cache.glob("*.json"))  # no file I/O in the bubble's budget
    profiler.store()  # between bubbles (Jobs.profiled)
    assert len(list(profile_cache.glob("*.json"))) == 1


def test_a_profile_whose_job_ran_out_of_work_ends_without_failing_the_job(jobs_dir: Path, profile_cache: Path) -> None:
    """A small job's early steps can finish its slice while larger sizes are still being measured; its next
    measurements do no units. They used to make a ProfilePoint of 0 items (ValueError: the job Failed although its
    work was done, seen in a 20-job queue run); now the profile ends with the sizes measured, and is shared only
    with jobs no larger than its largest batch."""
    clock = _Clock()
    profiler = _profiler(jobs_dir, clock, [1.0] * 100, total=64)
    while profiler.batch_size == 2:
        profiler.measure_one()
    task = profiler.task
    profiler.pause()
    while not task.done():
        task.step(16)
    profiler.measure_one()
    while profiler.result is None:
        profiler.measure_one()
    assert [p.batch_size for p in profiler.result.points] == [2] and profiler.stopped_by == "work"
    profiler.store()
    (record,) = profile_cache.glob("*.json")
    assert not json.loads(record.read_text())["complete"]


def test_a_step_longer_than_the_bubbles_is_measured_piece_by_piece_within_them(jobs_dir: Path) -> None:
    """An encoder of 3 layers runs its steps in 3 pieces of 4 ms here: a 12 ms step in bubbles of 9.5 ms. Measured
    whole, each measurement ran 2.5 ms or more past a bubble (the first size is measured whatever its prediction,
    issue #31: sentence-embedding's 30 ms steps in 10 ms bubbles overran by 20 ms each). Measured piece by piece, no
    measurement passes a bubble's end, and the profile holds the whole step and its pieces."""
    clock = _Clock()
    task = open_task(write_job(jobs_dir, "enc", total=10**5, parameters={**PARAMS, "layers": 3, "batchSizes": [2]}))
    workload = task.workload
    run_piece = workload.run_piece

    def timed(carry: object, index: int) -> object:
        clock.ns += 4 * MS
        return run_piece(carry, index)

    workload.run_piece = timed  # type: ignore[method-assign]
    profiler = BubbleProfiler(task, CPU, memory_budget_bytes=1 << 30, warmup=1, repeats=3, clock=clock)
    profiler.hints = {2: 0.012}  # the warm step measured before the first bubble
    measured = 0
    for _ in range(200):
        measured += _bubble(profiler, clock, left_ms=9.5)  # no measurement past the bubble's end (in _bubble)
        clock.ns += 20 * MS
        if profiler.result is not None:
            break
    assert profiler.result is not None and measured == 3 * (1 + 3)  # every piece of 4 steps, each in a bubble
    (point,) = profiler.result.points
    assert point.step_s == pytest.approx(0.012) and point.piece_s == pytest.approx((0.004,) * 3)


def _until_done(profiler: BubbleProfiler, clock: _Clock, *, left_ms: float, limit: int = 60) -> list[int]:
    """Bubbles of ``left_ms`` until the profile is complete, each followed by what the runner does between bubbles
    (a measurement that is due there); the measurements run in each bubble, -1 for one run between them."""
    runs = []
    while profiler.result is None and len(runs) < limit:
        runs.append(_bubble(profiler, clock, left_ms=left_ms))
        if due_between(profiler):
            profiler.measure_one()
            runs.append(-1)
    return runs


def test_a_measurement_a_slow_spell_stretched_does_not_end_the_profile(jobs_dir: Path) -> None:
    """Size 2 measured at 1 ms a step; size 4's first measurement took 10 ms (a slow spell, 5 times the 2 ms size 2
    predicts for it). Its bound, 1.5 × its slowest, fits no 5 ms bubble: after PROFILE_MISSES bubbles that measurement
    is dropped (once) and size 4 is measured at its real 2 ms. A size really that slow is given up as before."""
    clock = _Clock()
    profiler = _profiler(jobs_dir, clock, [1.0] * 6 + [10.0] + [2.0] * 100)
    for _ in range(7):
        profiler.measure_one()  # between bubbles: size 2 (warm-up + 5), then size 4's first: 10 ms
    assert profiler.batch_size == 4 and (profiler.bound_s() or 0) >= PROFILE_BOUND * 0.010
    runs = _until_done(profiler, clock, left_ms=5.0)
    # missed, dropped, taken again between bubbles (2 ms), then measured in the bubbles
    assert runs[: PROFILE_MISSES + 1] == [0] * PROFILE_MISSES + [-1] and max(runs) > 0, runs
    assert profiler.result is not None and [p.batch_size for p in profiler.result.points] == [2, 4]
    assert profiler.result.points[1].step_s == pytest.approx(0.002)

    slow = _Clock()
    really = _profiler(jobs_dir / "really", slow, [1.0] * 6 + [10.0] * 100)
    for _ in range(7):
        really.measure_one()
    runs = _until_done(really, slow, left_ms=5.0)
    assert runs == [0] * PROFILE_MISSES + [-1] + [0] * PROFILE_MISSES, runs  # 10 ms again, between bubbles
    assert really.result is not None and [p.batch_size for p in really.result.points] == [2]


def test_a_size_whose_linear_prediction_fits_no_bubble_is_measured_between_them_before_it_is_given_up(
    jobs_dir: Path,
) -> None:
    """Size 2 takes 3 ms a step, size 4 only 3.5 ms (steps grow far slower than linearly): predicted by scaling at
    6 ms, bounded at 9 ms, size 4 fits no 8 ms bubble. Before it is given up it is measured once between bubbles,
    and then in the bubbles, by what it takes."""
    clock = _Clock()
    profiler = _profiler(jobs_dir, clock, [3.0] * 6 + [3.5] * 100)
    profiler.hints = {}
    for _ in range(6):
        profiler.measure_one()  # size 2, between bubbles
    assert profiler.batch_size == 4 and (profiler.bound_s() or 0) >= PROFILE_BOUND * 0.006
    runs = _until_done(profiler, clock, left_ms=8.0)
    assert runs[: PROFILE_MISSES + 1] == [0] * PROFILE_MISSES + [-1] and max(runs) > 0, runs
    assert profiler.result is not None and [p.batch_size for p in profiler.result.points] == [2, 4]
