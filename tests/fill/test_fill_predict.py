"""The step model the runner sizes steps with, and the in-bubble profiler's predictions: pure arithmetic on a fake
clock, plus one real workload for the profiler's slow first step."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from fill_helpers import write_job

from pipefill.spec import load_file
from pipefill_fill.device import step_clock
from pipefill_fill.predict import COLD_RATIO, COLD_TRIES, EndModel, StepModel
from pipefill_fill.profiler import BubbleProfiler
from pipefill_fill.task import FillTask, TaskSpec

MS = 1_000_000
PROFILE = {1: 0.001, 4: 0.002, 16: 0.005, 64: 0.017}


class Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def test_base_interpolates_and_never_decreases_with_the_batch() -> None:
    model = StepModel({1: 0.004, 2: 0.003, 4: 0.002, 8: 0.006})  # a noisy profile: small batches slower
    assert [model.base_s(b) for b in (1, 2, 4)] == pytest.approx([0.003, 0.003, 0.003])  # pooled, not the maximum
    assert model.base_s(6) == pytest.approx(0.0045)
    exact = StepModel(PROFILE)
    assert exact.base_s(10) == pytest.approx(0.002 + 0.003 * 6 / 12)
    assert exact.base_s(1) == 0.001


def test_largest_fitting_sizes_the_step_to_the_time_left() -> None:
    model = StepModel(PROFILE, cold_ratio=1.0)  # nothing measured yet, no cold margin: the base must fit
    assert model.largest_fitting(0.050, 64) == 64
    assert model.largest_fitting(0.050, 32) == 32  # never above the most efficient batch it is given
    assert model.largest_fitting(0.00351, 64) == 10  # 4 + 12 × (0.0015 ÷ 0.003)
    assert model.largest_fitting(0.00351, 64, any_size=False) == 4  # training: profiled sizes only
    assert model.largest_fitting(0.0009, 64) is None
    for left_s in (0.0011, 0.0023, 0.0041, 0.011, 0.0169):
        b = model.largest_fitting(left_s, 64)
        assert b is not None and model.predict_s(b) <= left_s < model.predict_s(b + 1)


def test_slow_steps_of_one_bubble_kind_do_not_slow_the_others() -> None:
    clock = Clock()
    model = StepModel(PROFILE, clock=clock, warm=4)
    assert model.factor("steady") == 1.0
    for _ in range(8):
        model.record(16, 0.010, "end-of-step")  # twice the profile: the trainer still runs on the core
        model.record(16, 0.0051, "steady")
    assert model.predict_s(16, "end-of-step") == pytest.approx(0.010)
    assert model.predict_s(16, "steady") == pytest.approx(0.0051)
    assert model.predict_s(16, "cool-down") == pytest.approx(0.010)  # unseen kind: every kind's quantile
    assert model.largest_fitting(0.0101, 64, "end-of-step") == 16
    assert model.largest_fitting(0.0101, 64, "steady") == 35


def test_a_burst_of_slow_steps_is_forgotten() -> None:
    clock = Clock()
    model = StepModel(PROFILE, clock=clock, warm=4, horizon_s=10.0, cold_ratio=1.0)
    for _ in range(8):
        model.record(64, 0.170, "steady")  # another process took the core: ten times slower
    assert model.largest_fitting(0.008, 64, "steady") is None  # nothing fits, so nothing new is measured …
    clock.ns += 11 * 10**9
    assert model.factor("steady") == 1.0  # … until the burst ages out
    assert model.largest_fitting(0.008, 64, "steady") == 28


def test_a_step_runs_when_its_expected_overrun_is_within_budget() -> None:
    clock = Clock()
    model = StepModel(PROFILE, clock=clock)
    for i in range(20):  # one step in ten runs half again as long as usual
        clock.ns += 10**6
        model.record(16, 0.0075 if i % 10 == 9 else 0.005, "steady")
    # the tail: batch 1 overruns 1.1 ms one time in ten, by 0.4 ms: 40 µs expected, within the 50 µs budget
    assert model.largest_fitting(0.0011, 64, "steady") == 1
    assert model.predict_s(1, "steady") == pytest.approx(0.0015)  # a fixed 99th percentile would not run it
    # a large step: the same one-in-ten would cost milliseconds, so it keeps a margin of nearly half
    big = model.largest_fitting(0.017, 64, "steady")
    assert big is not None and 30 < big < 64
    assert 0.017 / model.base_s(big) > 1.45


def test_an_interrupted_step_stays_out_of_the_quantile() -> None:
    clock = Clock()
    model = StepModel(PROFILE, clock=clock)
    for i in range(20):
        clock.ns += 10**6
        model.record(16, 0.005 * (1 + i / 200), "warm-up")
    before = model.predict_s(16, "warm-up")
    model.record(16, 0.040, "warm-up")  # eight times its prediction: another process had the core
    assert model.interrupted == 1 and model.predict_s(16, "warm-up") == before == pytest.approx(0.005 * 1.095)


def test_a_profile_taken_on_a_busy_machine_is_corrected_by_the_steps_run() -> None:
    clock = Clock()
    model = StepModel({1: 0.006, 4: 0.002, 16: 0.005, 64: 0.017}, clock=clock)  # batch 1 measured while preempted
    assert model.largest_fitting(0.0035, 64) is None  # so no small step fits a short tail …
    for _ in range(16):
        for b, t in ((1, 0.0005), (4, 0.0010), (16, 0.0040), (64, 0.0150)):
            clock.ns += 10**6
            model.record(b, t, "steady")
    assert model.base_s(1) == pytest.approx(0.0005, rel=0.05)  # … until the steps run correct each anchor
    assert model.largest_fitting(0.0035, 64, "steady") == 14  # 4 + 12 × 2.5 ÷ 3


def test_profile_model_refuses_an_empty_profile() -> None:
    with pytest.raises(ValueError, match="at least one profiled batch size"):
        StepModel({})


def test_the_profilers_slow_first_step_is_not_a_prediction(jobs_dir: Path) -> None:
    params = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "batchSizes": [1, 4]}
    (job,) = load_file(write_job(jobs_dir, "p", total=100, parameters=params))
    task = FillTask(TaskSpec.from_spec(job))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    profiler = BubbleProfiler(task, torch.device("cpu"), memory_budget_bytes=1 << 30, warmup=2, repeats=3)
    assert profiler.predict_s() is None
    first = profiler.measure_one()
    assert profiler.predict_s() is None  # one-off costs: run the next one at a bubble's start too
    second = profiler.measure_one()
    assert profiler.predict_s() == second and first > 0
    while profiler.batch_size == 1:
        profiler.measure_one()
    point = profiler._points[0]
    assert profiler.predict_s() == pytest.approx(point.step_s * 4)  # the next size: scaled from the last


def test_the_end_is_planned_where_the_positions_own_record_puts_it() -> None:
    ends = EndModel(quantile=0.25, warm=4)
    steady, eos = ("steady", 2), ("end-of-step", -1)
    assert ends.end_ns(steady, 100 * MS) == 100 * MS  # nothing seen: the trainer's expected end
    for late_ms in (2.0, 1.5, 3.0, 2.5, 1.0, 2.2, 1.8, 2.9):  # this position always lasts longer than predicted
        ends.record(steady, int((50 + late_ms) * MS), 50 * MS)
    for off_ms in (-0.8, 0.3, -0.1, 0.6):  # this one is predicted to within a millisecond, either way
        ends.record(eos, int((50 + off_ms) * MS), 50 * MS)
    assert ends.end_ns(steady, 100 * MS) == 100 * MS  # late every time, but never planned past the expected end
    assert ends.end_ns(eos, 100 * MS) == int(99.9 * MS)
    assert EndModel(quantile=0.0, warm=1).end_ns(steady, 7) == 7
    with pytest.raises(ValueError, match=r"quantile 1\.5 must be within 0\.\.1"):
        EndModel(quantile=1.5)


def test_on_an_idle_priority_cpu_a_step_costs_its_cpu_time_not_its_wall_time() -> None:
    """At SCHED_IDLE the trainer preempts a fill step whose bubble ended early: the wall time then includes the
    trainer's work, which the profile and the step model must not take as the step's cost."""
    cpu = torch.device("cpu")
    wall, cost = step_clock(cpu, idle=False), step_clock(cpu, idle=True)
    w0, c0 = wall(), cost()
    time.sleep(0.05)  # the step's thread off the core: what a preemption looks like to it
    waited_ns, cost_ns = wall() - w0, cost() - c0
    assert waited_ns >= 50 * MS and cost_ns < 5 * MS
    assert step_clock(torch.device("cuda"), idle=True) is time.monotonic_ns  # a GPU step's time is wall time


def test_a_model_that_measured_nothing_sizes_steps_with_the_cold_margin_until_it_must_run_one() -> None:
    """#31: a new job's first steps, from its profile alone, had no margin ("the base fits"): half ran past the
    deadline. Now COLD_RATIO × base must fit; a model refused COLD_TRIES times in a row sizes by the base alone (a job
    whose steps are longer than its bubbles ÷ COLD_RATIO still runs and learns)."""
    model = StepModel(PROFILE)
    assert model.largest_fitting(0.0054, 64, any_size=False) == 4  # 16 (5 ms) fits only by its base
    assert model.largest_fitting(0.0076, 64, any_size=False) == 16  # 1.5 × 5 ms
    b = model.largest_fitting(0.0054, 64)
    assert b is not None and model.base_s(b) * COLD_RATIO <= 0.0054 < model.base_s(b + 1) * COLD_RATIO
    short = StepModel({16: 0.005})
    for _ in range(COLD_TRIES):
        assert short.largest_fitting(0.006, 16, any_size=False) is None
    assert short.largest_fitting(0.006, 16, any_size=False) == 16
    short.record(16, 0.005)
    assert short.cold_refusals == 0  # a step ran: the margin is back until the model is warm


def test_a_new_model_takes_over_the_measured_steps_of_the_last_one() -> None:
    """#31: a job's complete profile, or the next job of the workload, starts from the steps measured already (each
    against the new model's own base), not cold."""
    profile = {1: 0.001, 16: 0.005, 64: 0.017}
    assert StepModel(profile).largest_fitting(0.0055, 64, "steady", any_size=False) == 1  # cold: 16 needs 7.5 ms
    for measured_s, fitting in ((0.005, 16), (0.0075, 1)):  # steps as profiled; steps half again as long
        clock = Clock()
        old = StepModel(PROFILE, clock=clock)
        for _ in range(8):
            clock.ns += MS
            old.record(16, measured_s, "steady")
        new = StepModel(profile, clock=clock)
        new.adopt_ratios(old)
        assert new.factor("steady") == pytest.approx(measured_s / 0.005)
        assert new.largest_fitting(0.0055, 64, "steady", any_size=False) == fitting
