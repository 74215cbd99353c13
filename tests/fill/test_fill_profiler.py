"""The profiler: real measurements per batch size, an inference job's measured steps its work (a training job's and
the whole profile at once undone), cache per (workload, device)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fill_helpers import write_job

from pipefill.plan import ProfilePoint
from pipefill.spec import load_file
from pipefill_fill.active import tail_sizes
from pipefill_fill.profiler import BubbleProfiler, profile_task
from pipefill_fill.store import read_outputs
from pipefill_fill.task import FillTask, TaskSpec
from pipefill_fill.warmup import warm

PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "batchSizes": [1, 4, 16]}


def _task(manifest: Path) -> FillTask:
    (job,) = load_file(manifest)
    task = FillTask(TaskSpec.from_spec(job))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    return task


def test_profile_measures_each_batch_and_does_no_work(jobs_dir: Path) -> None:
    task = _task(write_job(jobs_dir, "p", total=100, parameters=PARAMS))
    profile = profile_task(task, torch.device("cpu"), memory_budget_bytes=1 << 30, warmup=1, repeats=3)
    assert [p.batch_size for p in profile.points] == [1, 4, 16] and not profile.cached
    assert all(p.step_s > 0 and p.peak_bytes >= 0 for p in profile.points)
    assert task.workload.state() == {"next_sample": 0} and task.store.pending == 0
    task.step(3)
    task.commit()
    assert read_outputs(task.spec.output_dir)["sample_id"].tolist() == [0, 1, 2]


def test_profile_cache_per_workload_and_device(jobs_dir: Path) -> None:
    task = _task(write_job(jobs_dir, "p", total=100, parameters=PARAMS))
    first = profile_task(task, torch.device("cpu"), memory_budget_bytes=1 << 30, warmup=1, repeats=1)
    again = profile_task(task, torch.device("cpu"), memory_budget_bytes=1 << 30, warmup=1, repeats=1)
    assert again.cached and again.points == first.points
    changed = _task(write_job(jobs_dir, "p", total=100, parameters={**PARAMS, "hiddenSize": 16}))
    assert not profile_task(changed, torch.device("cpu"), memory_budget_bytes=1 << 30, warmup=1, repeats=1).cached


def test_profile_stops_at_remaining_samples_and_budget(jobs_dir: Path) -> None:
    task = _task(write_job(jobs_dir, "small", total=3, parameters=PARAMS))
    profile = profile_task(task, torch.device("cpu"), memory_budget_bytes=1 << 30, warmup=0, repeats=1)
    assert [(p.batch_size, p.items) for p in profile.points] == [(1, 1), (4, 3)]
    train = {"features": 8, "hidden": 16, "classes": 3, "batchSize": 8}
    clf = _task(write_job(jobs_dir, "clf", builtin="train-classifier", kind="training", total=5, parameters=train))
    before = clf.workload.state()
    (point,) = profile_task(clf, torch.device("cpu"), memory_budget_bytes=1 << 30, warmup=1, repeats=2).points
    assert (point.batch_size, point.items) == (8, 1)  # counted in steps
    after = clf.workload.state()
    assert after["steps"] == before["steps"] == 0
    assert all(torch.equal(after["model"][k], before["model"][k]) for k in before["model"])


def test_warm_up_calls_each_size_outside_bubbles_and_its_times_predict_the_profile(jobs_dir: Path) -> None:
    task = _task(write_job(jobs_dir, "w", total=100, parameters=PARAMS))
    warmed = task.warm_up([1, 4, 16], device=torch.device("cpu"))
    assert list(warmed) == [1, 4, 16] and all(s > 0 for s in warmed.values())
    assert task.workload.state() == {"next_sample": 0} and task.store.pending == 0 and task.progress == 0  # no work
    task.step(4)
    assert not task.first_call  # its first call was the warm-up's
    profiler = BubbleProfiler(task, torch.device("cpu"), memory_budget_bytes=1 << 30)
    profiler.hints = {1: 0.5, 4: 9.0}
    assert profiler.predict_s() == 0.5  # the first step of a fresh job: its warm time, not "unknown"
    while profiler.batch_size == 1:
        profiler.measure_one()
    assert profiler.predict_s() == 9.0  # above the linear scaling of size 1: the hint


def test_sizes_a_profile_predicts_are_called_once_each_and_only_the_others_twice(jobs_dir: Path) -> None:
    task = _task(write_job(jobs_dir, "w", total=100, parameters=PARAMS))
    calls: list[int] = []
    step = task.workload.step
    task.workload.step = lambda b: calls.append(b) or step(b)  # type: ignore[method-assign]
    assert list(task.warm_up([2, 8], device=torch.device("cpu"), timed=False)) == [2, 8] and calls == [2, 8]
    calls.clear()
    assert list(task.warm_up([3], device=torch.device("cpu"))) == [3] and calls == [3, 3]  # the second one timed
    assert task.workload.state() == {"next_sample": 0} and task.progress == 0  # no work
    # through the executor's record of the sizes called: an untimed call is known called, but its first call's time
    # is no warm step's and never a hint
    known: dict[int, float | None] = {}
    job = SimpleNamespace(task=task)
    calls.clear()
    assert warm(known, job, [2, 8], torch.device("cpu"), instance=False, timed=False) == ([2, 8], {})  # type: ignore[arg-type]
    assert known == {2: None, 8: None} and calls == [2, 8]
    called, hints = warm(known, job, [1, 2], torch.device("cpu"), instance=False)  # type: ignore[arg-type]
    assert called == [1] and list(hints) == [1] and calls == [2, 8, 1, 1]  # 2 is not called again


def test_every_size_up_to_the_largest_profiled_is_warmed_when_cheap(jobs_dir: Path) -> None:
    cheap = SimpleNamespace(profile=SimpleNamespace(points=[ProfilePoint(4, 1e-3, 0), ProfilePoint(16, 4e-3, 0)]))
    cheap.any_batch_size = True
    assert tail_sizes(cheap) == list(range(1, 17))  # 0.25 ms × 136 samples ≪ 1 s
    dear = SimpleNamespace(profile=SimpleNamespace(points=[ProfilePoint(4, 0.4, 0), ProfilePoint(16, 1.6, 0)]))
    dear.any_batch_size = True
    assert tail_sizes(dear) == [4, 16]  # a second per sample: the profiled sizes only
    cheap.any_batch_size = False
    assert tail_sizes(cheap) == [4, 16]  # training runs its profiled sizes only


@pytest.mark.parametrize(("total", "sizes"), [(24, [1, 4]), (40, [1, 4, 16]), (56, [1, 4, 16])])
def test_an_inference_jobs_measured_steps_are_its_work(
    jobs_dir: Path, profile_cache: Path, total: int, sizes: list[int]
) -> None:
    """Issue #30: in a queue of small jobs each job's measured steps were thrown away (7 steps of each size, more
    than some jobs' samples). An inference job's measured steps are now its next batches, committed as any step's.
    Warm-up 1, 3 measured (4 steps a size): sizes 1 and 4 take 20 samples, then batch 16. With 24 samples the one
    batch of 16 is clipped to 4, no measurement of 16: the profile ends with [1, 4], cut short by the work. With 40
    the warm-up step of 16 ran in full (the clipped batch after it is not counted), with 56 a step past the warm-up
    too: 16 is kept and the profile complete."""
    task = _task(write_job(jobs_dir, "w", total=total, parameters=PARAMS))
    profiler = BubbleProfiler(task, torch.device("cpu"), memory_budget_bytes=1 << 30, warmup=1, repeats=3)
    assert profiler.productive and profiler.result is None
    done = 0
    while profiler.result is None:
        profiler.measure_one()
        done += profiler.last_items
    assert done == total and task.done()  # all of it, in measured steps
    assert [p.batch_size for p in profiler.result.points] == sizes
    assert all(p.items_per_step is None for p in profiler.result.points)  # full batches only
    assert profiler.stopped_by == ("work" if sizes[-1] < 16 else "")
    assert task.finish()
    assert read_outputs(task.spec.output_dir)["sample_id"].tolist() == list(range(total))  # each sample once


@pytest.mark.parametrize(("total", "items"), [(64, None), (10, 10)])
def test_a_slice_no_larger_than_the_first_size_still_gets_a_profile(
    jobs_dir: Path, profile_cache: Path, total: int, items: int | None
) -> None:
    """The only size is 64. A slice of 64 is all done by the first measured step, a warm-up one; a slice of 10 by one
    batch cut short. Each is the size's only measurement, and it is kept: a profile with no size left the job with no
    step model, and so no bubble for its last commit, for good (the executor skipped every bubble for "memory")."""
    params = {**PARAMS, "batchSizes": [64]}
    task = _task(write_job(jobs_dir, "s", total=total, parameters=params))
    profiler = BubbleProfiler(task, torch.device("cpu"), memory_budget_bytes=1 << 30)
    profiler.measure_one()
    assert task.done() and profiler.last_items == total
    while profiler.result is None:
        profiler.measure_one()
    assert [(p.batch_size, p.items_per_step) for p in profiler.result.points] == [(64, items)]
    assert task.finish()
    assert read_outputs(task.spec.output_dir)["sample_id"].tolist() == list(range(total))


def test_a_measured_step_that_reaches_the_slice_end_leaves_the_slice_undone(jobs_dir: Path) -> None:
    """A measured step moves the workload, not the work: between the measurements of a size that covers the whole
    slice, the slice is not done. (It was: the executor marked it done with nothing committed between two bubbles,
    and the job failed when its outputs were assembled, "the chunks end at sample 0".) A slice marked done before its
    samples are all committed is refused, never recorded."""
    task = _task(write_job(jobs_dir, "m", total=16, parameters=PARAMS))  # batch 16 is the whole slice
    profiler = BubbleProfiler(task, torch.device("cpu"), memory_budget_bytes=1 << 30, warmup=0, repeats=2)
    profiler.productive = False  # measured steps that are undone, as a training job's (an inference job's: below)
    while profiler.batch_size < 16:
        profiler.measure_one()
    profiler.measure_one()
    assert task.workload.done() and profiler.result is None
    assert not task.done()
    with pytest.raises(RuntimeError, match=r"marked done at 0"):
        task.store.mark_done()
    profiler.measure_one()
    assert profiler.result is not None and [p.batch_size for p in profiler.result.points] == [1, 4, 16]
    assert not task.done() and task.workload.state() == {"next_sample": 0}
    task.step(16)
    assert task.done() and task.finish()
    assert read_outputs(task.spec.output_dir)["sample_id"].tolist() == list(range(16))
