"""Slices of a job: the plan, its persistence, per-slice exactly-once stores, and the job's outputs assembled once,
byte-identical to a run that did not split the job."""

from __future__ import annotations

import itertools
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from fill_helpers import write_job

from pipefill.queue import plan_slices
from pipefill.spec import SpecError, load_file
from pipefill_fill.profiler import BubbleProfiler
from pipefill_fill.slices import JobDir, PlanMismatch, SliceState
from pipefill_fill.store import read_outputs
from pipefill_fill.task import FillTask, TaskSpec
from pipefill_fill.work import Slice

PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16}
CPU = torch.device("cpu")


def _spec(manifest: Path, plan: list[Slice] | None = None) -> TaskSpec:
    """The job with its plan of record: ``plan``, else plan_slices as the operator (or the files source) writes it."""
    (job,) = load_file(manifest)
    spec = TaskSpec.from_spec(job)  # type: ignore[arg-type]
    planned = plan_slices(spec.total, parallel_ranks=spec.parallel_ranks, min_units=spec.min_slice_units)
    return TaskSpec.from_spec(job, plan=plan or planned)  # type: ignore[arg-type]


def _open(spec: TaskSpec, s: Slice | None = None) -> FillTask:
    task = FillTask(spec, s)
    task.open(device=CPU, memory_budget_bytes=1 << 30)
    return task


def _run(task: FillTask, batch_size: int, *, commit_every: int = 2) -> bool:
    steps = 0
    while not task.done():
        task.step(batch_size)
        steps += 1
        if steps % commit_every == 0:
            task.commit()
    return task.finish()


@pytest.mark.parametrize(
    ("total", "ranks", "min_units", "count"),
    [
        (4096, 1, 64, 1),
        (4096, 2, 64, 8),
        (4096, 3, 64, 12),
        (600, 2, 64, 8),
        (300, 4, 64, 4),
        (50, 4, 64, 1),
        (10**9, 16, 64, 64),
        # the default (spec.minSliceSamples 512): the queue's small jobs are not cut into slices of a bubble's work
        (256, 2, None, 1),
        (1024, 2, None, 2),
        (4096, 2, None, 8),
        (12800, 2, None, 8),
        (1, 4, 1, 1),
        (8, 4, 1, 8),
    ],
)
def test_plan_tiles_the_job(total: int, ranks: int, min_units: int | None, count: int) -> None:
    extra = {} if min_units is None else {"min_units": min_units}
    slices = plan_slices(total, parallel_ranks=ranks, **extra)
    assert len(slices) == count
    assert slices[0].start == 0 and slices[-1].end == total
    assert all(a.end == b.start for a, b in itertools.pairwise(slices))
    assert max(s.end - s.start for s in slices) - min(s.end - s.start for s in slices) <= 1


def test_a_plan_of_record_that_differs_from_storage_is_refused(jobs_dir: Path) -> None:
    out = jobs_dir / "out" / "j"
    spec = _spec(write_job(jobs_dir, "j", total=1000, max_parallel_ranks=2, output=out))
    assert len(JobDir(spec).plan()) == 8  # the first opener records the plan of record in slices.json
    recorded = (out / "slices.json").read_bytes()
    other = _spec(write_job(jobs_dir, "j", total=1000, max_parallel_ranks=4, output=out))
    with pytest.raises(
        PlanMismatch,
        match=r"FillJob j: status\.slices plans bounds .*15 slices.* but .*slices\.json "
        r"records .*8 slices.*untouched\. Give the job a new spec\.output\.path",
    ):
        JobDir(other).plan()
    with pytest.raises(PlanMismatch):
        FillTask(other, other.plan[0])
    assert (out / "slices.json").read_bytes() == recorded and sorted(p.name for p in out.iterdir()) == ["slices.json"]
    with pytest.raises(
        ValueError, match=r"FillJob j: status\.slices: the plan covers \[0, 1000\) but the job has 2000"
    ):
        _spec(write_job(jobs_dir, "j", total=2000, max_parallel_ranks=2, output=out), plan=spec.slices)
    with pytest.raises(ValueError, match="its plan has 8 slices"):
        FillTask(spec)
    with pytest.raises(ValueError, match=r"\[0, 10\) is not one of its slices"):
        FillTask(spec, Slice(0, 10))


def test_a_directory_from_before_slices_stays_one_slice(jobs_dir: Path) -> None:
    out = jobs_dir / "out" / "old"
    unsplit = _spec(write_job(jobs_dir, "old", total=200, parameters=PARAMS, output=out))
    task = _open(unsplit)
    task.step(30)
    task.commit()
    (out / "slices.json").unlink()  # as an older executor left it
    split = _spec(write_job(jobs_dir, "old", total=200, parameters=PARAMS, output=out, max_parallel_ranks=2))
    with pytest.raises(PlanMismatch, match=r"records \[0, 200\]"):
        JobDir(split).plan()
    assert not (out / "slices.json").exists()
    assert _open(unsplit, Slice(0, 200)).committed == 30


def test_split_run_is_byte_identical_and_assembled_once(jobs_dir: Path) -> None:
    reference = _spec(write_job(jobs_dir, "ref", total=700, parameters=PARAMS))
    assert _run(_open(reference), 16, commit_every=8)
    spec = _spec(write_job(jobs_dir, "split", total=700, parameters=PARAMS, max_parallel_ranks=2))
    job = JobDir(spec)
    plan = job.plan()
    assert len(plan) == 8 and not (spec.output_dir / "chunks").exists()
    rng = random.Random(7)
    order = rng.sample(plan, len(plan))  # slices finish in any order, at any batch size
    for i, s in enumerate(order):
        task = _open(spec, s)
        assert task.workload.state() == {"next_sample": s.start}
        complete = _run(task, rng.choice([5, 16, 64]), commit_every=3)
        assert complete == (i == len(order) - 1) and job.done() == complete
        assert job.committed() == sum(x.end - x.start for x in order[: i + 1])
    assert (spec.output_dir / "outputs.npy").read_bytes() == (reference.output_dir / "outputs.npy").read_bytes()
    assert read_outputs(spec.output_dir)["sample_id"].tolist() == list(range(700))


def test_completion_runs_once_among_concurrent_finishers(jobs_dir: Path) -> None:
    spec = _spec(write_job(jobs_dir, "c", total=256, parameters=PARAMS, max_parallel_ranks=2))
    job = JobDir(spec)
    for s in job.plan():  # every slice done, the job not completed: as after a crash of the last finisher
        task = _open(spec, s)
        while not task.done():
            task.step(32)
        task.commit()
        task.store.mark_done()
    assert not job.done() and not (spec.output_dir / "outputs.npy").exists()
    calls: list[int] = []
    barrier = threading.Barrier(4)

    def finish() -> None:
        barrier.wait()
        assert JobDir(spec).complete(lambda: calls.append(1))

    threads = [threading.Thread(target=finish) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and job.done()
    assert np.load(spec.output_dir / "outputs.npy")["sample_id"].tolist() == list(range(256))


def test_reopening_a_done_slice_completes_a_job_left_incomplete(jobs_dir: Path) -> None:
    spec = _spec(write_job(jobs_dir, "r", total=128, parameters=PARAMS, max_parallel_ranks=2))
    plan = JobDir(spec).plan()
    for s in plan:
        task = _open(spec, s)
        while not task.done():
            task.step(8)
        task.commit()
        task.store.mark_done()
    assert not (spec.output_dir / "outputs.npy").exists()
    recovered = _open(spec, plan[-1]).recovered
    assert recovered is not None and recovered.done and JobDir(spec).done()
    assert (spec.output_dir / "outputs.npy").exists()


def test_slice_store_recovers_from_its_start(jobs_dir: Path) -> None:
    spec = _spec(write_job(jobs_dir, "s", total=512, parameters=PARAMS, max_parallel_ranks=2))
    s = JobDir(spec).plan()[3]
    task = _open(spec, s)
    task.step(10)
    task.commit()
    task.step(7)  # lost with the process
    again = _open(spec, s)
    assert again.recovered is not None and (again.recovered.end, again.committed) == (s.start + 10, s.start + 10)
    assert again.workload.state() == {"next_sample": s.start + 10}
    while not again.done():
        again.step(100)  # the step never runs past the slice
    assert again.progress == s.end


def test_a_workload_that_ignores_its_slice_is_told_what_to_fix(jobs_dir: Path) -> None:
    spec = _spec(
        write_job(jobs_dir, "u", builtin=None, import_path="userwork:FromZero", total=256, max_parallel_ranks=2)
    )
    task = _open(spec, JobDir(spec).plan()[1])
    with pytest.raises(ValueError, match=r"consecutive from 64 \(this executor's slice of the job is \[64, 128\)\)"):
        task.step(4)


def test_training_is_not_split(jobs_dir: Path) -> None:
    kw = {"builtin": "train-classifier", "kind": "training", "total": 10, "max_parallel_ranks": 2}
    manifest = write_job(jobs_dir, "t", **kw)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"spec\.maxParallelRanks is 2 but must be 1 for a training workload"):
        load_file(manifest)


def test_a_measurement_to_the_slice_end_leaves_the_slice_open_for_its_work(jobs_dir: Path) -> None:
    # a profile taken in bubbles leaves the workload where its last measurement moved it until the next bubble; a step
    # of 64 from the start of a slice of 64 moves it to the slice's end, its outputs dropped. Taken for done there,
    # the slice was marked done with nothing committed (an executor between bubbles: Jobs._settle) and the job was
    # reported Succeeded with outputs.npy short of a slice
    spec = _spec(write_job(jobs_dir, "m", total=128, parameters={**PARAMS, "batchSizes": [64]}, max_parallel_ranks=2))
    first = JobDir(spec).plan()[0]
    task = _open(spec, first)
    profiler = BubbleProfiler(task, CPU, memory_budget_bytes=1 << 30)
    assert profiler.result is None  # nothing cached: measured here
    profiler.productive = False  # measured steps that are undone, as a training job's (an inference job's are its work)
    profiler.measure_one()
    assert task.workload.done() and (task.progress, task.committed, task.store.pending) == (0, 0, 0)
    assert not task.done() and not task.commit_due()
    while profiler.result is None:  # the rest of the profile: the workload back at the slice's progress
        profiler.measure_one()
    assert not task.workload.done() and not task.done()
    assert not _run(task, 24, commit_every=1)  # the other slice is still open
    assert JobDir(spec).states()[0] == SliceState(first, first.end, True)
    assert read_outputs(spec.output_dir)["sample_id"].tolist() == list(range(first.start, first.end))


def test_a_workload_done_before_its_slice_end_fails_the_slice_not_done(jobs_dir: Path) -> None:
    spec = _spec(
        write_job(jobs_dir, "e", builtin=None, import_path="userwork:EndsEarly", total=128, max_parallel_ranks=2)
    )
    s = JobDir(spec).plan()[1]
    task = _open(spec, s)
    task.step(4)
    assert task.done()  # its done() says so at 68 of [64, 128)
    with pytest.raises(RuntimeError, match=r"slice \[64, 128\) is not marked done: its samples \[68, 128\) were never"):
        task.finish()
    assert JobDir(spec).states()[1] == SliceState(s, 68, False)
    assert not (spec.output_dir / "outputs.npy").exists()
