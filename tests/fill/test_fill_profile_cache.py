"""The profile cache is shared by every job of a workload (issue #30): a second FillJob of the same model is not
profiled again; a changed parameter, code or device, a larger memory budget or a larger job than the one that cut the
profile short is."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from commit_helpers import Bubble, cpu_jobs, dispatcher
from fill_helpers import write_job
from usercode_helpers import user_job, write_code

from pipefill import env
from pipefill.events import EventWriter
from pipefill.spec import load_file
from pipefill_fill.inbubble import BubbleOutcome
from pipefill_fill.profilecache import load_cached, profile_dir
from pipefill_fill.profiler import BubbleProfiler, profile_task
from pipefill_fill.sources import Identity, open_source
from pipefill_fill.task import FillTask, TaskSpec

PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "batchSizes": [1, 4, 16]}
CPU = torch.device("cpu")
GIB = 1 << 30


def _task(manifest: Path) -> FillTask:
    (job,) = load_file(manifest)
    task = FillTask(TaskSpec.from_spec(job))  # type: ignore[arg-type]
    task.open(device=CPU, memory_budget_bytes=GIB)
    return task


def _profile(task: FillTask, budget: int = GIB) -> bool:
    """Profile ``task`` (or load it); whether it came from the cache."""
    return profile_task(task, CPU, memory_budget_bytes=budget, warmup=0, repeats=1).cached


def test_a_second_job_of_the_workload_is_not_profiled_again(jobs_dir: Path, profile_cache: Path) -> None:
    first = _task(write_job(jobs_dir, "eval-1", total=100, parameters=PARAMS))
    assert not _profile(first)
    (record,) = profile_cache.glob("profile-*.json")
    assert json.loads(record.read_text())["complete"] and not (first.spec.output_dir / "profiles").exists()
    second = _task(write_job(jobs_dir, "eval-2", total=50, parameters=PARAMS, priority=3))  # another job, same model
    assert _profile(second)
    profiler = BubbleProfiler(second, CPU, memory_budget_bytes=GIB)
    assert profiler.result is not None and profiler.result.cached  # the runner starts filling at once
    assert [p.batch_size for p in profiler.result.points] == [1, 4, 16]


def test_a_changed_parameter_or_device_is_profiled_again(jobs_dir: Path) -> None:
    assert not _profile(_task(write_job(jobs_dir, "a", total=100, parameters=PARAMS)))
    assert not _profile(_task(write_job(jobs_dir, "b", total=100, parameters={**PARAMS, "hiddenSize": 16})))
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # another device key (a CPU's is its model and torch's threads)
    try:
        assert not _profile(_task(write_job(jobs_dir, "c", total=100, parameters=PARAMS)))
    finally:
        torch.set_num_threads(threads)
    assert _profile(_task(write_job(jobs_dir, "d", total=100, parameters=PARAMS)))


def test_changed_user_code_is_profiled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = tmp_path / "storage"
    monkeypatch.setenv(env.FILL_STORAGE_DIR, str(storage))
    write_code(storage / "code", factor=2.0)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    assert not _profile(_task(user_job(jobs, "u1", importPath="embed:Scaled", code={"path": "code"})))
    # (40 samples cut the profile short at batch 64: it serves jobs of up to 32)
    assert _profile(_task(user_job(jobs, "u2", total=20, importPath="embed:Scaled", code={"path": "code"})))
    write_code(storage / "code", factor=3.0)  # the same path, other code
    assert not _profile(_task(user_job(jobs, "u3", total=20, importPath="embed:Scaled", code={"path": "code"})))


def test_job_specific_limits_stay_right(jobs_dir: Path) -> None:
    # a job of 3 samples stops at batch 4 (3 items): its profile serves jobs no larger, not a job of 100
    small = _task(write_job(jobs_dir, "small", total=3, parameters=PARAMS))
    own = profile_task(small, CPU, memory_budget_bytes=GIB, warmup=0, repeats=1)
    assert [(p.batch_size, p.items) for p in own.points] == [(1, 1), (4, 3)]  # the job's own profile is unchanged
    assert load_cached(_task(write_job(jobs_dir, "tiny", total=1, parameters=PARAMS)), CPU) is not None
    big = _task(write_job(jobs_dir, "big", total=100, parameters=PARAMS))
    assert load_cached(big, CPU) is None
    assert not _profile(big)  # measured again, and the complete profile replaces the partial one
    assert _profile(_task(write_job(jobs_dir, "big-2", total=100, parameters=PARAMS)))
    # a smaller memory budget takes the points that fit it
    cached = load_cached(big, CPU, memory_budget_bytes=GIB)
    assert cached is not None
    peaks = sorted(p.peak_bytes for p in cached.points)
    if peaks[-1] > 0:  # Linux gives the CPU's peak (VmHWM); elsewhere every peak is 0
        fits = load_cached(big, CPU, memory_budget_bytes=peaks[-1] - 1)
        assert fits is None or all(p.peak_bytes < peaks[-1] for p in fits.points)


def test_a_profile_stopped_by_a_smaller_budget_is_measured_again_with_a_larger(jobs_dir: Path) -> None:
    task = _task(write_job(jobs_dir, "m", total=100, parameters=PARAMS))
    profiler = BubbleProfiler(task, CPU, memory_budget_bytes=1, warmup=0, repeats=1)
    while profiler.result is None:
        profiler.measure_one()
    assert profiler.stopped_by == "memory" or not profiler.result.points
    assert load_cached(task, CPU, memory_budget_bytes=GIB) is None  # more memory here: larger batches may fit


def test_the_cache_lives_where_every_executor_finds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env.FILL_PROFILE_DIR)
    monkeypatch.setenv(env.FILL_STORAGE_DIR, str(tmp_path / "storage"))
    assert profile_dir() == tmp_path / "storage" / ".pipefill" / "profiles"  # every rank pod mounts the storage
    monkeypatch.delenv(env.FILL_STORAGE_DIR)
    assert profile_dir().name.startswith("pipefill-profiles-")  # every job of this executor
    monkeypatch.setenv(env.FILL_PROFILE_DIR, str(tmp_path / "p"))
    assert profile_dir() == tmp_path / "p"


def test_a_slice_that_runs_out_of_work_mid_profile_ends_it_with_the_sizes_measured(
    jobs_dir: Path, profile_cache: Path
) -> None:
    """A job works with the sizes measured so far while the larger ones are measured (issue #25). When that work ends
    its slice first, nothing is left to measure the next size with: the profile ends with the sizes it has (a point of
    0 items used to fail the job) and its record is incomplete, so a larger job measures the larger sizes."""
    task = _task(write_job(jobs_dir, "short", total=6, parameters=PARAMS))
    profiler = BubbleProfiler(task, CPU, memory_budget_bytes=GIB, warmup=0, repeats=1)
    profiler.measure_one()
    assert [p.batch_size for p in profiler.points] == [1] and profiler.result is None
    profiler.pause()  # real steps, with batch 1, to the slice's end
    while not task.done():
        task.step(1)
    profiler.measure_one()  # batch 4: no work left
    assert profiler.result is not None and profiler.stopped_by == "work"
    assert [p.batch_size for p in profiler.result.points] == [1]
    profiler.store()  # between bubbles
    (record,) = profile_cache.glob("profile-*.json")
    assert not json.loads(record.read_text())["complete"]
    assert load_cached(_task(write_job(jobs_dir, "long", total=100, parameters=PARAMS)), CPU) is None
    assert load_cached(_task(write_job(jobs_dir, "one", total=1, parameters=PARAMS)), CPU) is not None


def test_jobs_of_one_workload_active_together_measure_its_profile_once(
    tmp_path: Path, jobs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs of one workload started together: the first measures the profile, in bubbles; the other waits for it
    and takes it from the cache, also when the rest of a bubble is handed on because the first one's next measurement
    did not fit (CI: the other measured in that rest, the same points again) and in the bubble where the first one's
    profile was completed, before it is cached."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env.WORK_SOURCE, f"files:{jobs_dir}")
    for name in ("p0", "p1"):
        write_job(jobs_dir, name, total=10**4, parameters=PARAMS, output=tmp_path / "out" / name)
    source = open_source(f"files:{jobs_dir}", identity=Identity("train", 0))
    jobs = cpu_jobs(source, EventWriter(None))
    try:
        jobs.refresh()
        assert list(jobs.active) == ["p0", "p1"] and all(a.profile is None for a in jobs.active.values())
        fill = dispatcher(tmp_path, jobs).fill
        for i, length_s in enumerate([1e-5, *[2.0] * 20]):  # one too short for any measurement, then long ones
            now = time.monotonic_ns()
            b = Bubble(i, now, now + int(length_s * 1e9))
            job, why, _out, _batch = fill(b, b.expected_end_ns, length_s)
            assert (job, why) == ("p0", "profiling")
            # the rest of the bubble, without p0: p1 does not measure the profile p0 is measuring (or has measured)
            job, why, out, _batch = fill(b, b.expected_end_ns, length_s, exclude="p0")
            assert job != "p1" and not out.steps and not jobs.active["p1"].profiler.points, (job, why, out)
            if jobs.active["p0"].profile is not None:
                break
        assert jobs.active["p0"].profile is not None, "p0's profile was never completed"
        jobs.after_bubble("p0", out)  # p0's profile is taken in and cached; p1 takes it from there
        p1 = jobs.active["p1"].profile
        assert p1 is not None and p1.cached and jobs.active["p1"].profile_taken
    finally:
        jobs.shutdown()
        source.close()


def test_a_slice_after_one_that_cut_its_profile_short_measures_the_larger_sizes_and_works(
    tmp_path: Path, jobs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #31's user-code stall (``bench fill --life`` beside other tests: every bubble skipped for "memory" for
    good): a job's early steps ended its first slice while its profile was measured, and the profile ended with the
    sizes measured so far, cached for smaller jobs only. Its next slice found no profile it could use, yet the job
    still counted as having taken one in: neither measured nor given a bubble. Now the next slice measures on from the
    larger sizes (not the ones measured already) and works in the bubbles to its end."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env.WORK_SOURCE, f"files:{jobs_dir}")
    write_job(jobs_dir, "j", total=256, parameters=PARAMS, output=tmp_path / "out" / "j", max_parallel_ranks=2)
    source = open_source(f"files:{jobs_dir}", identity=Identity("train", 0))
    jobs = cpu_jobs(source, EventWriter(None))
    try:
        jobs.refresh()
        a = jobs.active["j"]
        first = a.slice
        assert first.end - first.start < 256  # slices of 64
        while not a.profiler.points:
            a.profiler.measure_one()  # batch 1 measured in bubbles
        a.profiler.pause()  # the job works with it meanwhile, to its slice's end
        while not a.task.done():
            a.task.step(1)
        a.task.commit()
        a.profiler.measure_one()  # batch 4: no work left to measure it with
        assert a.profile is not None and a.profiler.stopped_by == "work"
        jobs.after_bubble("j", BubbleOutcome())  # the profile taken in; the slice done, the next one claimed
        a = jobs.active["j"]
        second = a.slice
        assert second != first and a.profile is None and a.profiler.batch_size == 4  # on from batch 4, not 1
        fill = dispatcher(tmp_path, jobs).fill
        for i in range(30):
            now = time.monotonic_ns()
            b = Bubble(i, now, now + int(2e9))
            job, why, out, _batch = fill(b, b.expected_end_ns, 2.0)
            assert job == "j", (i, job, why)  # the stall: (None, "memory") in every bubble
            if (pending := jobs.active["j"].task.inflight) is not None:
                pending.wait(10)  # its file part: the time between bubbles
            jobs.after_bubble("j", out)
            if "j" not in jobs.active or jobs.active["j"].slice != second:
                break
        else:
            raise AssertionError(f"slice {second} was not finished in 30 bubbles: {jobs.active['j'].task.progress}")
        # the first slice's size and the larger ones, none twice (its measured steps are its work: 64 samples measure
        # batch 4 in full, batch 16 only where a step of it went past the warm-up before the slice's end)
        assert [p.batch_size for p in a.profiler.points] in ([1, 4], [1, 4, 16])
    finally:
        jobs.shutdown()
        source.close()


def test_a_job_let_go_of_mid_profile_leaves_its_sizes_to_the_next_job_of_the_workload(
    tmp_path: Path, jobs_dir: Path, monkeypatch: pytest.MonkeyPatch, profile_cache: Path
) -> None:
    """A queue of small jobs (issue #30, ``bench fill-queue``'s 100 jobs of 64-192 samples): a job's early steps
    finished it before its profile was complete, nothing was cached, and the next job of the workload measured batch
    sizes 1, 2, 4... again, so no profile was ever complete. Now a job let go of mid-profile caches the sizes it
    measured as an incomplete profile, the next job goes on from the next larger size, and a complete record is never
    replaced by such a one. A training job's profile cut short is not cached (it would be taken for complete)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env.WORK_SOURCE, f"files:{jobs_dir}")
    write_job(jobs_dir, "q1", total=64, parameters=PARAMS, output=tmp_path / "out" / "q1")
    source = open_source(f"files:{jobs_dir}", identity=Identity("train", 0))
    jobs = cpu_jobs(source, EventWriter(None))
    try:
        jobs.refresh()
        a = jobs.active["q1"]
        while not a.profiler.points:
            a.profiler.measure_one()  # batch 1, in bubbles
        assert a.profile is None
        jobs.let_go("q1", "its slice is done (the test)")
    finally:
        jobs.shutdown()
        source.close()
    (record,) = profile_cache.glob("profile-*.json")
    data = json.loads(record.read_text())
    assert not data["complete"] and [p["batch_size"] for p in data["points"]] == [1]
    following = _task(write_job(jobs_dir, "q2", total=1000, parameters=PARAMS))
    profiler = BubbleProfiler(following, CPU, memory_budget_bytes=GIB, warmup=0, repeats=1)
    assert profiler.result is None and [p.batch_size for p in profiler.points] == [1] and profiler.batch_size == 4
    while profiler.result is None:
        profiler.measure_one()  # 4 and 16 only
    assert [p.batch_size for p in profiler.result.points] == [1, 4, 16]
    profiler.store()
    assert json.loads(record.read_text())["complete"]
    late = BubbleProfiler(_task(write_job(jobs_dir, "q3", total=1000, parameters=PARAMS)), CPU, memory_budget_bytes=GIB)
    assert late.result is not None and late.result.cached  # the complete record: nothing left to measure
    before = {p.name: p.read_text() for p in profile_cache.glob("profile-*.json")}
    late._points = list(late.result.points[:1])  # a job of that workload that had measured one size only
    late.result = None
    late.store_unfinished()
    assert {p.name: p.read_text() for p in profile_cache.glob("profile-*.json")} == before  # the complete one stays
    train = {"features": 8, "hidden": 16, "classes": 3, "batchSize": 8}
    clf = _task(write_job(jobs_dir, "clf", builtin="train-classifier", kind="training", total=50, parameters=train))
    trainer = BubbleProfiler(clf, CPU, memory_budget_bytes=GIB, warmup=0, repeats=1)
    while not trainer.points:
        trainer.measure_one()
    trainer.result = None  # let go of before its profile was complete
    trainer.store_unfinished()
    assert {p.name: p.read_text() for p in profile_cache.glob("profile-*.json")} == before  # not cached
