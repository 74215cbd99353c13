"""Commits split in two (issue #31): the device part inside a bubble, the file part off the filling thread; a last
commit that does not fit waits for a bubble where it does; exactly once across a kill between the parts."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from commit_helpers import (
    PARAMS,
    Bubble,
    HeldWriter,
    bubble,
    cpu_jobs,
    dispatcher,
    open_task,
    run_bubble,
    stub_dispatcher,
)
from fill_helpers import subprocess_env, write_job
from launched import popen

from pipefill import env
from pipefill.events import CommitEvent, EventWriter, JobEvent, read_events
from pipefill_fill.inbubble import DEFER_BUBBLES, DEFER_S, BubbleOutcome, commit_between
from pipefill_fill.predict import Estimator
from pipefill_fill.sources import Identity, open_source
from pipefill_fill.store import ProgressStore, read_outputs, read_pointer
from pipefill_fill.task import FillTask


def test_a_slow_disk_never_holds_a_bubble(jobs_dir: Path) -> None:
    task = open_task(write_job(jobs_dir, "enc", total=10**4, parameters=PARAMS))
    writer = task.writer = HeldWriter()
    try:
        first = bubble(task, left_s=0.02, commit_s=0.0)
        assert first.steps and task.commit_due() != bool(first.commits_ns)  # work, due for a commit: made at the
        # bubble's end when its last step ended in time, else at the next one's start
        made = first if first.commits_ns else bubble(task, left_s=0.02, commit_s=0.0, bubble_id=1)
        assert made.commits_ns and made.steps and task.inflight is not None  # the device part, in a bubble ...
        assert writer.started.wait(10) and not task.inflight.done.is_set()  # ... which ended with the file part held
        staged = task.inflight.staged.end
        for i in range(3):  # while it is held: bubbles go on, and no second commit is staged behind it
            out = bubble(task, left_s=0.02, commit_s=0.0, bubble_id=2 + i)
            assert out.steps and not out.commits_ns and not task.inflight.done.is_set()
        assert task.committed == 0 and read_pointer(task.store.dir, start=0) == (0, False)
        writer.release.set()
        pending = task.settle(timeout_s=10)
        assert pending is not None and pending.written > 0 and pending.write_s > 0
        assert task.committed == staged and read_pointer(task.store.dir, start=0)[0] == staged
        assert bubble(task, left_s=0.02, commit_s=0.0, bubble_id=9).commits_ns  # the next one goes in
        assert task.settle(timeout_s=10) is not None and task.committed == task.progress - task.store.pending
    finally:
        writer.release.set()
        writer.close(10)


def _between(task: FillTask) -> tuple[int, int] | None:
    return commit_between(task, Estimator(default_s=3600.0), cost_clock=time.thread_time_ns)


def test_a_commit_that_fits_no_bubble_is_made_between_bubbles_after_the_limit(jobs_dir: Path) -> None:
    """It was made at the next bubble's start anyway, and overran that bubble by what it did not fit."""
    task = open_task(write_job(jobs_dir, "enc", total=16, parameters=PARAMS))
    out = bubble(task, left_s=60.0, commit_s=3600.0)
    assert task.done() and out.stop == "done" and not out.commits_ns and task.inflight is None
    for i in range(DEFER_BUBBLES):
        assert _between(task) is None  # not yet: a bubble whose start fits it may come
        assert not bubble(task, left_s=0.01, commit_s=3600.0, bubble_id=1 + i).commits_ns
    assert task.deferred == DEFER_BUBBLES and task.committed == 0
    assert not bubble(task, left_s=0.01, commit_s=3600.0, bubble_id=99).commits_ns  # never in a bubble
    made = _between(task)
    assert made is not None and made[0] <= made[1] and task.inflight is not None and task.inflight.between
    assert task.settle(timeout_s=10) is not None and task.durable and task.committed == 16 and task.deferred == 0


def test_the_executor_makes_a_commit_no_bubble_fits_between_bubbles(
    tmp_path: Path, jobs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the executor's jobs and dispatcher: a slice whose commits fit no bubble still completes, its device
    parts made between bubbles (``at``: between), none in a bubble."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env.WORK_SOURCE, f"files:{jobs_dir}")
    write_job(jobs_dir, "j", total=64, parameters=PARAMS, output=tmp_path / "out" / "j")
    source = open_source(f"files:{jobs_dir}", identity=Identity("train", 0))
    log = tmp_path / "fill-events.jsonl"
    events = EventWriter(log)
    jobs = cpu_jobs(source, events)
    try:
        jobs.refresh()
        d = dispatcher(tmp_path, jobs)

        def bubble_of(i: int, length_s: float) -> BubbleOutcome:
            now = time.monotonic_ns()
            b = Bubble(i, now, now + int(length_s * 1e9))
            job, _why, out, _batch = d.fill(b, b.expected_end_ns, length_s)
            if job is not None:
                jobs.after_bubble(job, out)
            return out

        i = 0
        while (a := jobs.active["j"]).profile is None or not a.profile_taken:  # profiled in long bubbles
            bubble_of(i, 0.2)
            i += 1
            assert i < 200, "the profile was never completed"
        a.commit_estimate = Estimator(default_s=3600.0)  # from now on no commit fits a bubble
        deadline = time.monotonic() + 60
        while "j" in jobs.active:
            d.commit_between()  # as the runner's loop does between bubbles
            jobs.settle()
            if "j" in jobs.active:
                assert not bubble_of(i, 0.005).commits_ns, "a commit made in a bubble"
                i += 1
            assert time.monotonic() < deadline, "the job never completed"
    finally:
        jobs.shutdown()
        source.close()
        events.close()
    commits = [e for e in read_events(log) if isinstance(e, CommitEvent)]
    assert commits[-1].end == 64 and commits[-1].at == "between", commits
    phases = [e.phase for e in read_events(log) if isinstance(e, JobEvent) and e.job == "j"]
    assert phases[-1] == "Succeeded", phases


def test_a_commit_that_fits_no_bubble_waits_at_most_a_second(jobs_dir: Path) -> None:
    task = open_task(write_job(jobs_dir, "enc", total=16, parameters=PARAMS))
    bubble(task, left_s=60.0, commit_s=3600.0)
    for i in range(3):
        assert not bubble(task, left_s=0.01, commit_s=3600.0, bubble_id=1 + i).commits_ns
    assert task.deferred == 3 and task.committed == 0
    first = task.deferred_since_ns
    assert 0 < time.monotonic_ns() - first < DEFER_S * 1e9  # the first deferral's time, kept across the others
    assert _between(task) is None
    task.deferred_since_ns = first - int(DEFER_S * 1e9)  # as if that first one was a second ago: few bubbles since
    assert _between(task) is not None  # made between bubbles
    assert task.settle(timeout_s=10) is not None and task.durable and task.committed == 16 and task.deferred == 0


def test_a_kill_between_the_parts_of_a_deferred_last_commit_loses_nothing_and_repeats_nothing(jobs_dir: Path) -> None:
    clean = write_job(jobs_dir / "a", "clean", total=40, parameters=PARAMS)
    killed = write_job(jobs_dir / "b", "killed", total=40, parameters=PARAMS)
    reference = popen([sys.executable, "-m", "_drive", str(clean), "8", "1"], env=subprocess_env(), text=True)
    proc = popen(
        [sys.executable, "-m", "_stage_kill", str(killed)],
        stdout=subprocess.PIPE,
        env=subprocess_env(),
        text=True,
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline().split() for _ in range(3)]
    assert [w[0] if w else "" for w in lines] == ["COMMITTED", "DEFERRED", "STAGED"], lines
    assert (int(lines[0][1]), int(lines[2][1])) == (16, 40)
    proc.send_signal(signal.SIGKILL)  # the last commit's device part is made; its file part is not
    proc.communicate(timeout=30)
    out = jobs_dir / "b" / "out" / "killed"
    recovered = ProgressStore(out, job="killed", with_outputs=True).recover()
    assert recovered.end == 16 and recovered.state is not None and not recovered.done  # the staged work is redone
    again = popen(
        [sys.executable, "-m", "_drive", str(killed), "8", "1"],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = again.communicate(timeout=120)
    assert again.returncode == 0 and stdout.split()[:2] == ["READY", "16"], stderr
    assert reference.wait(timeout=120) == 0
    rows = read_outputs(out)
    assert rows["sample_id"].tolist() == list(range(40))  # each sample once
    a = np.load(jobs_dir / "a" / "out" / "clean" / "outputs.npy")
    assert (out / "outputs.npy").read_bytes() == (jobs_dir / "a" / "out" / "clean" / "outputs.npy").read_bytes()
    assert rows.tobytes() == a.tobytes()


def test_a_slice_waiting_for_its_last_commit_gets_the_next_bubble(jobs_dir: Path, tmp_path: Path) -> None:
    """Whatever job the bubble's class belongs to, a done slice's last commit goes first (else a job that holds no
    class would never finish)."""
    done = open_task(write_job(jobs_dir, "done", total=8, parameters=PARAMS))
    bubble(done, left_s=60.0, commit_s=3600.0)  # all its work, its last commit deferred
    other = open_task(write_job(jobs_dir, "other", total=10**4, parameters=PARAMS))
    assert done.done() and done.commit_due() and not other.done()
    dispatcher = stub_dispatcher(tmp_path, {"other": other, "done": done})
    for i, expect in ((1, "done"), (2, "other")):  # "other" holds the class (the first of the ready jobs)
        now = time.monotonic_ns()
        name, _, out, _ = dispatcher.fill(Bubble(i, now, now + 50 * 10**6), now + 50 * 10**6, 0.05)
        assert name == expect, out
        if expect == "done":
            assert out.commits_ns and not out.steps and done.inflight is not None
    # then the bubbles go to the class's job again


def test_a_last_commit_that_fits_no_bubble_holds_up_neither_other_last_commits_nor_work(
    jobs_dir: Path, tmp_path: Path
) -> None:
    """A done slice whose last commit is predicted longer than the bubble waits (the wait counted towards its commit
    between bubbles); the bubble goes to another done slice's last commit that fits, else to a job with work. In
    bench fill-queue the first finished job's commit, predicted at 15.7 ms after one slow commit, took 19 bubbles of
    10 ms in a row and did nothing in them while two finished jobs behind it waited for theirs."""
    slow, quick = (open_task(write_job(jobs_dir, n, total=8, parameters=PARAMS)) for n in ("slow", "quick"))
    for task in (slow, quick):
        bubble(task, left_s=60.0, commit_s=3600.0)  # all its work, its last commit deferred
    other = open_task(write_job(jobs_dir, "other", total=10**4, parameters=PARAMS))
    dispatcher = stub_dispatcher(tmp_path, {"slow": slow, "quick": quick, "other": other})
    dispatcher.jobs.active["slow"].commit_estimate = Estimator(default_s=1.0)  # longer than any bubble here
    deferred = slow.deferred
    for i, expect in ((1, "quick"), (2, "other")):
        now = time.monotonic_ns()
        name, _, out, _ = dispatcher.fill(Bubble(i, now, now + 50 * 10**6), now + 50 * 10**6, 0.05)
        assert name == expect, (name, out)
        assert (out.commits_ns and not out.steps) if expect == "quick" else out.steps  # its last commit; work
    assert slow.commit_due() and slow.deferred == deferred + 2  # towards its commit between bubbles
    assert not quick.commit_due()
    for done in ("quick", "other"):  # nothing left but the commit that fits no bubble: the bubble runs nothing
        dispatcher.jobs.active.pop(done)
    now = time.monotonic_ns()
    name, _, out, _ = dispatcher.fill(Bubble(3, now, now + 50 * 10**6), now + 50 * 10**6, 0.05)
    assert (name, out.steps, out.commits_ns, out.stop) == ("slow", 0, [], "done")
    assert slow.deferred == deferred + 3  # one bubble, counted once


def test_the_jobs_of_one_workload_share_their_commit_estimate(
    tmp_path: Path, jobs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each job commits a few times: its own estimate's high quantile was its slowest commit. The jobs of a workload
    on the executor share one, measured once before the first (a dry commit); another workload has its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env.WORK_SOURCE, f"files:{jobs_dir}")
    for name, params in (("a", PARAMS), ("b", PARAMS), ("wide", {**PARAMS, "hiddenSize": 64})):
        write_job(jobs_dir, name, total=64, parameters=params, output=tmp_path / "out" / name)
    source = open_source(f"files:{jobs_dir}", identity=Identity("train", 0))
    jobs = cpu_jobs(source, EventWriter(None), max_active=3)
    try:
        jobs.refresh()
        a, b, wide = (jobs.active[n].commit_estimate for n in ("a", "b", "wide"))
        assert a is b and a is not wide and len(a) == 1 and len(wide) == 1  # one dry commit each
    finally:
        jobs.shutdown()
        source.close()


def test_a_bubble_the_trainer_closed_makes_no_commit_after_its_last_step(jobs_dir: Path) -> None:
    """The trainer came back before the expected end (on a GPU it would wait for the commit's device part): the last
    commit waits for the next bubble, which an open bubble's would not."""
    now = time.monotonic_ns()
    b = Bubble(0, now, now + 60 * 10**9)
    closed = open_task(write_job(jobs_dir, "closed", total=8, parameters=PARAMS))
    out = run_bubble(closed, b, commit_s=0.0, is_open=lambda _id: not closed.done())  # closes with the last step
    assert out.steps and closed.done() and closed.commit_due() and not out.commits_ns
    still_open = open_task(write_job(jobs_dir, "open", total=8, parameters=PARAMS))
    out = run_bubble(still_open, b, commit_s=0.0)
    assert out.steps and still_open.done() and out.commits_ns and not still_open.commit_due()


def test_a_commits_device_part_is_measured_before_the_first(jobs_dir: Path) -> None:
    task = open_task(write_job(jobs_dir, "enc", total=64, parameters=PARAMS))
    task.step(8)
    assert task.dry_commit_s() > 0  # what start-up records as the first commit's prediction
    assert (task.committed, task.store.staged, task.store.pending, task.inflight) == (0, 0, 8, None)  # nothing made
    assert not list((task.store.dir / "checkpoints").iterdir())


def test_a_job_let_go_with_a_commit_in_flight_logs_that_commit_then_its_release_at_the_pointer_kept(
    jobs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Suspended (its assignment gone) while the file part of a commit is being written: that commit still lands, so
    ``Released`` waits for it and names the pointer the storage keeps, after the commit's own event. (It was logged at
    once with the pointer before the write, and the write's event never: CI saw a stop at 1 385 and a storage at
    1 762.)"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env.WORK_SOURCE, f"files:{jobs_dir}")
    manifest = write_job(jobs_dir, "enc", total=10**4, parameters=PARAMS, output=tmp_path / "out" / "enc")
    source = open_source(f"files:{jobs_dir}", identity=Identity("train", 0))
    log, writer = tmp_path / "fill-events.jsonl", HeldWriter()
    jobs = cpu_jobs(source, EventWriter(log), writer=writer)

    def events() -> list[JobEvent | CommitEvent]:
        jobs.events.flush()
        return [e for e in read_events(log) if isinstance(e, CommitEvent) or (isinstance(e, JobEvent) and e.job)]

    try:
        jobs.refresh()
        task = jobs.active["enc"].task
        task.step(8)
        assert task.stage_commit() is not None and writer.started.wait(10)  # its file part held
        manifest.unlink()  # no longer offered here: as when suspended
        jobs.refresh()
        assert "enc" not in jobs.active and [e.phase for e in events() if isinstance(e, JobEvent)] == ["Running"]
        writer.release.set()
        assert task.inflight is not None and task.inflight.wait(10)
        jobs.settle()
        *_, commit, release = events()
        assert isinstance(commit, CommitEvent) and commit.end == 8
        assert isinstance(release, JobEvent) and (release.phase, release.committed) == ("Released", 8)
        assert not jobs.releasing
    finally:
        writer.release.set()
        jobs.shutdown()
        source.close()
        jobs.events.close()
