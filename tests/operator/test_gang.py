"""The gang's lifecycle, decided by one pure function: every transition of docs/operator.md#lifecycle, and that a
decision replayed on its own result changes nothing (what makes the operator safe to kill at any point)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from pipefill.lifecycle import Decision, Observed, PodView, Termination, decide
from pipefill.lifecycle.conditions import find
from pipefill.spec import JobPhase, PipelineTrainingJob, PipelineTrainingJobStatus, parse

T0 = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
WORLD = 4


def _job(**run_policy: Any) -> PipelineTrainingJob:
    job = parse(
        {
            "apiVersion": "pipefill.io/v1alpha1",
            "kind": "PipelineTrainingJob",
            "metadata": {"name": "j"},
            "spec": {
                "model": {"preset": "gpt-tiny"},
                "pipeline": {"stages": 2, "microbatches": 4, "globalBatch": 16, "dataParallel": 2},
                "runPolicy": run_policy,
            },
        }
    )
    assert isinstance(job, PipelineTrainingJob)
    return job


def _pod(rank: int, gen: int = 0, *, state: str = "running", **kw: Any) -> PodView:
    fields: dict[str, Any] = {
        "name": f"j-{rank}",
        "rank": rank,
        "generation": gen,
        "phase": "Running",
        "deleting": False,
    }
    if state == "running":
        fields["trainer_running"] = True
    elif state == "pending":
        fields["phase"] = "Pending"
    fields.update(kw)
    return PodView(**fields)


def _exited(rank: int, code: int, gen: int = 0, message: str = "") -> PodView:
    phase = "Succeeded" if code == 0 else "Failed"
    return _pod(
        rank, gen, state="ended", phase=phase, trainer=Termination(code, "Error" if code else "Completed", message)
    )


def _step(
    job: PipelineTrainingJob,
    status: PipelineTrainingJobStatus,
    pods: list[PodView],
    *,
    at_s: float = 0,
    gen: int = 1,
    **observed: Any,
) -> Decision:
    now = T0 + datetime.timedelta(seconds=at_s)
    return decide(job, status, Observed(pods=pods, now=now, **observed), job_generation=gen)


def _running(job: PipelineTrainingJob) -> PipelineTrainingJobStatus:
    first = _step(job, PipelineTrainingJobStatus(), [])
    return _step(job, first.status, [_pod(r) for r in range(WORLD)]).status


def _reasons(d: Decision) -> list[str]:
    return [e.reason for e in d.events]


def _cond(status: PipelineTrainingJobStatus, kind: str) -> tuple[str, str] | None:
    c = find(status.conditions, kind)
    return None if c is None else (c.status, c.reason)


def _assert_stable(job: PipelineTrainingJob, d: Decision, pods: list[PodView], **observed: Any) -> None:
    """Deciding again on the written status with the same pods writes nothing and posts nothing."""
    again = _step(job, d.status, pods, **observed)
    assert again.status == d.status and again.events == [] and again.create_ranks == [] and not again.delete_job


def test_a_new_job_creates_every_rank_then_runs() -> None:
    job = _job()
    first = _step(job, PipelineTrainingJobStatus(), [])
    assert first.create_ranks == [0, 1, 2, 3] and first.delete_pods == []
    assert first.status.phase == JobPhase.PENDING and first.status.start_time == "2026-03-01T12:00:00Z"
    assert _cond(first.status, "Created") == ("True", "PodsCreated") and _reasons(first) == []
    assert first.status.observed_generation == 1
    half = _step(job, first.status, [_pod(0), _pod(1), _pod(2, state="pending"), _pod(3, state="pending")])
    assert half.status.phase == JobPhase.PENDING and half.status.ranks_ready == 2 and half.create_ranks == []
    pods = [_pod(r) for r in range(WORLD)]
    running = _step(job, half.status, pods)
    assert running.status.phase == JobPhase.RUNNING and running.status.ranks_ready == WORLD
    assert _cond(running.status, "Running") == ("True", "AllRanksRunning") and _reasons(running) == []
    _assert_stable(job, running, pods)


def test_a_pod_created_but_not_yet_seen_is_created_again_not_counted_as_lost() -> None:
    job = _job()
    first = _step(job, PipelineTrainingJobStatus(), [])
    partial = _step(job, first.status, [_pod(0, state="pending")])
    assert partial.create_ranks == [1, 2, 3] and partial.status.restarts == partial.status.disruptions == 0


def test_retryable_exit_restarts_the_whole_gang_once_after_the_old_one_is_gone() -> None:
    job = _job()
    status = _running(job)
    failed = [_pod(0), _exited(1, 75, message="peer timeout"), _pod(2), _pod(3)]
    restart = _step(job, status, failed)
    s = restart.status
    assert (s.phase, s.generation, s.restarts, s.disruptions) == (JobPhase.RESTARTING, 1, 1, 0)
    assert restart.delete_pods == ["j-0", "j-1", "j-2", "j-3"] and restart.create_ranks == []
    assert _reasons(restart) == ["TrainerFailed"]
    message = restart.events[0].message
    assert "rank 1 (pod j-1): trainer exited with code 75: peer timeout" in message and "restart 1/3" in message
    # The operator dies after writing the status and deleting two pods: replayed, it neither restarts again nor
    # creates the new generation while an old pod is left (names, hostnames and the rendezvous are reused).
    dying = [_pod(0, deleting=True), _exited(1, 75, message="peer timeout"), _pod(2, deleting=True), _pod(3)]
    replay = _step(job, s, dying)
    assert replay.status == s and replay.events == [] and replay.create_ranks == []
    assert replay.delete_pods == ["j-1", "j-3"]
    gone = _step(job, s, [])
    assert gone.create_ranks == [0, 1, 2, 3] and gone.status.restarts == 1 and gone.status.phase == JobPhase.RESTARTING
    assert _reasons(gone) == ["PodsCreated"]  # a restart's gang is news (a new job's first is not: no Event)
    new = [_pod(r, 1) for r in range(WORLD)]
    back = _step(job, gone.status, new)
    assert back.status.phase == JobPhase.RUNNING and _cond(back.status, "Restarting") == ("False", "Restarted")
    assert _reasons(back) == ["Running"]  # a restarted gang running again is news, a new job's first one is not
    _assert_stable(job, back, new)


def test_backoff_limit_exhausted_fails_the_job_with_the_reason() -> None:
    job = _job(backoffLimit=1)
    status = _running(job)
    status.restarts, status.generation = 1, 0
    d = _step(job, status, [_exited(0, 143), _pod(1), _pod(2), _pod(3)])
    assert d.status.phase == JobPhase.FAILED and _cond(d.status, "Failed") == ("True", "BackoffLimitExceeded")
    assert "restarted 1 times (backoffLimit 1)" in d.events[0].message and "143 (SIGTERM)" in d.events[0].message
    assert d.delete_pods == ["j-1", "j-2", "j-3"]  # live pods stop; the failed one is kept for inspection
    assert d.status.completion_time == "2026-03-01T12:00:00Z"


@pytest.mark.parametrize(("first", "second"), [(1, 75), (75, 1)])
def test_a_permanent_exit_fails_the_job_whatever_its_peers_exit_with(first: int, second: int) -> None:
    job = _job()
    d = _step(job, _running(job), [_exited(0, first), _exited(1, second, message="bad data"), _pod(2), _pod(3)])
    assert d.status.phase == JobPhase.FAILED and d.status.restarts == 0
    rank = 0 if first == 1 else 1
    assert _cond(d.status, "Failed") == ("True", "TrainerFailed")
    assert f"rank {rank} (pod j-{rank}): trainer exited with code 1" in d.events[0].message


@pytest.mark.parametrize(
    "pods",
    [
        [_pod(0, disruption="PreemptionByScheduler"), _pod(1), _pod(2), _pod(3)],
        [
            _pod(0, state="ended", phase="Failed", disruption="Evicted: low memory", trainer=Termination(137, "", "")),
            _pod(1),
            _pod(2),
            _pod(3),
        ],
        [_pod(0, deleting=True), _pod(1), _pod(2), _pod(3)],
        [_pod(1), _pod(2), _pod(3)],  # lost: gone while the gang ran
    ],
    ids=["preempted", "evicted", "deleted", "lost"],
)
def test_disruptions_restart_without_counting_against_the_backoff_limit(pods: list[PodView]) -> None:
    job = _job(backoffLimit=0)
    d = _step(job, _running(job), pods)
    assert (d.status.phase, d.status.restarts, d.status.disruptions, d.status.generation) == (
        JobPhase.RESTARTING,
        0,
        1,
        1,
    )
    assert _cond(d.status, "Restarting") == ("True", "Disrupted") and "not counted" in d.events[0].message


def test_a_pod_failed_before_its_trainer_ran_is_a_counted_restart() -> None:
    job = _job()
    d = _step(
        job,
        _running(job),
        [_pod(0, state="ended", phase="Failed", failure="UnexpectedAdmissionError: x"), _pod(1), _pod(2), _pod(3)],
    )
    assert d.status.restarts == 1 and "failed: UnexpectedAdmissionError: x" in d.events[0].message


def test_fill_executor_restarts_are_reported_and_never_fail_the_job() -> None:
    job = _job()
    status = _running(job)
    pods = [_pod(0, fill_restarts=2), _pod(1), _pod(2), _pod(3)]
    d = _step(job, status, pods)
    assert d.status.phase == JobPhase.RUNNING and d.status.fill_restarts == 2
    assert _reasons(d) == ["FillExecutorRestarted"] and "rank 0: 2" in d.events[0].message
    _assert_stable(job, d, pods)


def test_a_fill_executor_restart_seen_with_a_trainer_failure_is_still_reported() -> None:
    """A sidecar restarted, and before the next look a trainer failed: both are news (the restart once lost its
    Event, the gang's restart resetting the count first)."""
    job = _job()
    status = _running(job)
    pods = [_pod(0, fill_restarts=1, fill_last_exit=137), _exited(1, 137), _pod(2), _pod(3)]
    d = _step(job, status, pods)
    assert _reasons(d) == ["FillExecutorRestarted", "TrainerFailed"]
    assert "rank 0: 1, last exited with code 137 (SIGKILL)" in d.events[0].message
    assert d.status.fill_restarts == 0 and d.status.generation == 1  # the next gang counts its own


def test_success_then_ttl_deletes_the_job() -> None:
    job = _job(ttlSecondsAfterFinished=30)
    done = [_exited(r, 0) for r in range(WORLD)]
    d = _step(job, _running(job), done)
    assert d.status.phase == JobPhase.SUCCEEDED and _cond(d.status, "Succeeded") == ("True", "TrainingFinished")
    assert d.requeue_after_s == 30 and not d.delete_job and d.delete_pods == []
    later = _step(job, d.status, done, at_s=29)
    assert later.requeue_after_s == pytest.approx(1) and not later.delete_job and later.events == []
    assert _step(job, d.status, done, at_s=30).delete_job


def test_a_success_records_the_final_step_whatever_the_last_metrics_read_said() -> None:
    job = _job()
    done = [_exited(r, 0) for r in range(WORLD)]
    read = _running(job)  # the status reader's last figures, a few seconds before the trainers ended
    read.current_step, read.progress, read.estimated_completion_time = 93, 93.0, "2026-03-01T12:00:09Z"
    d = _step(job, read, done)
    assert d.status.phase == JobPhase.SUCCEEDED and job.spec.steps == 100
    assert (d.status.current_step, d.status.progress, d.status.estimated_completion_time) == (100, 100.0, None)
    _assert_stable(job, d, done)
    d.status.current_step = 98  # a read that raced the end: set right at the next reconcile
    assert _step(job, d.status, done).status.current_step == 100
    failed = _step(job, read, [_exited(0, 1), *done[1:]])
    assert failed.status.phase == JobPhase.FAILED and failed.status.current_step == 93  # where it stopped


def test_one_rank_finished_early_keeps_the_job_running() -> None:
    job = _job()
    d = _step(job, _running(job), [_exited(0, 0), _pod(1), _pod(2), _pod(3)])
    assert d.status.phase == JobPhase.RUNNING and d.status.ranks_ready == 3 and d.events == []


def test_suspend_deletes_the_pods_and_resume_starts_a_new_generation_after_they_are_gone() -> None:
    suspended_job = _job(suspend=True)
    pods = [_pod(r) for r in range(WORLD)]
    status = _running(_job())
    d = _step(suspended_job, status, pods)
    assert d.status.phase == JobPhase.SUSPENDED and d.delete_pods == [p.name for p in pods]
    assert _reasons(d) == ["Suspended"] and d.status.restarts == 0
    _assert_stable(suspended_job, d, [])
    job = _job()
    resumed = _step(job, d.status, [_pod(0, deleting=True)])
    assert resumed.status.generation == 1 and resumed.create_ranks == [] and _reasons(resumed) == ["Resumed"]
    assert resumed.status.start_time is None
    start = _step(job, resumed.status, [])
    assert start.create_ranks == [0, 1, 2, 3] and start.status.restarts == 0


def test_active_deadline_counts_from_the_start_and_fails_the_job() -> None:
    job = _job(activeDeadlineSeconds=100)
    status = _running(job)
    pods = [_pod(r) for r in range(WORLD)]
    early = _step(job, status, pods, at_s=40)
    assert early.requeue_after_s == pytest.approx(60) and early.events == []
    late = _step(job, status, pods, at_s=100)
    assert late.status.phase == JobPhase.FAILED and _cond(late.status, "Failed") == ("True", "DeadlineExceeded")
    assert late.delete_pods == [p.name for p in pods]


def test_invalid_spec_is_reported_once_and_looked_at_again_when_the_spec_changes() -> None:
    job = _job()
    problems = ["spec.pipeline.schedule: Invalid value: '1f1b': needs microbatches >= ranks"]
    d = _step(job, PipelineTrainingJobStatus(), [], problems=problems)
    assert d.status.phase == JobPhase.FAILED and _cond(d.status, "InvalidSpec") == ("True", "InvalidSpec")
    assert _reasons(d) == ["InvalidSpec"] and d.create_ranks == [] and d.requeue_after_s is None
    _assert_stable(job, d, [], problems=problems)
    other = ["spec.resources.gpus: Invalid value: 2"]
    changed = _step(job, d.status, [], gen=2, problems=other)
    assert _reasons(changed) == ["InvalidSpec"] and find(changed.status.conditions, "InvalidSpec").message == other[0]  # type: ignore[union-attr]
    fixed = _step(job, changed.status, [], gen=3)
    assert fixed.create_ranks == [0, 1, 2, 3] and _reasons(fixed) == ["SpecFixed"]
    assert _cond(fixed.status, "InvalidSpec") == ("False", "SpecFixed") and fixed.status.phase == JobPhase.PENDING


def test_waiting_for_a_prerequisite_is_reported_once_and_clears_by_itself() -> None:
    job = _job()
    waiting = ("ConfigMapMissing", "ConfigMap 'sched' (spec.pipeline.customSchedule.name) does not exist")
    d = _step(job, PipelineTrainingJobStatus(), [], waiting=waiting)
    assert d.status.phase == JobPhase.WAITING and d.create_ranks == [] and _reasons(d) == ["ConfigMapMissing"]
    assert d.requeue_after_s == 60
    again = _step(job, d.status, [], waiting=waiting)
    assert again.status == d.status and again.events == []
    cleared = _step(job, d.status, [])
    assert cleared.create_ranks == [0, 1, 2, 3] and _cond(cleared.status, "Waiting") == ("False", "Resolved")


def test_checkpoints_not_shared_is_a_warning_once() -> None:
    job = _job()
    warn = (False, "CheckpointsNotShared", "spec.checkpoint has no claimName")
    d = _step(job, PipelineTrainingJobStatus(), [], checkpoints=warn)
    assert _reasons(d) == ["CheckpointsNotShared"]
    assert _cond(d.status, "CheckpointsShared") == ("False", "CheckpointsNotShared")
    pods = [_pod(r) for r in range(WORLD)]
    running = _step(job, d.status, pods, checkpoints=warn)
    assert "CheckpointsNotShared" not in _reasons(running)
    # told at `kubectl apply` by the chart's admission policy: recorded in the condition, no Event of its own
    told = _step(job, PipelineTrainingJobStatus(), [], checkpoints=warn, checkpoints_warned_at_admission=True)
    assert _reasons(told) == [] and _cond(told.status, "CheckpointsShared") == ("False", "CheckpointsNotShared")


def test_terminal_jobs_stop_their_remaining_pods_and_pods_of_a_newer_generation_are_adopted() -> None:
    job = _job()
    failed = _step(job, _running(job), [_exited(0, 2), _pod(1), _pod(2), _pod(3)]).status
    again = _step(job, failed, [_exited(0, 2), _pod(1, deleting=True), _pod(2), _pod(3, state="ended", phase="Failed")])
    assert again.delete_pods == ["j-2"] and again.events == []
    lost_status = PipelineTrainingJobStatus()  # e.g. the status was reset: the pods tell the generation
    adopted = _step(job, lost_status, [_pod(r, 5) for r in range(WORLD)])
    assert adopted.status.generation == 5 and adopted.status.phase == JobPhase.RUNNING and adopted.delete_pods == []


def test_a_spec_edited_while_the_gang_runs_is_reported_until_the_next_gang_takes_it() -> None:
    job = _job()
    running = _running(job)
    built_from_1 = [_pod(r, spec_generation=1) for r in range(WORLD)]
    same = _step(job, running, built_from_1, gen=1)
    assert _cond(same.status, "SpecChangePending") is None and same.events == []
    edited = _step(job, running, built_from_1, gen=2)  # the user edited the spec: metadata.generation 2
    assert _cond(edited.status, "SpecChangePending") == ("True", "AppliesAtNextStart")
    assert _reasons(edited) == ["SpecChangePending"] and edited.create_ranks == [] and edited.delete_pods == []
    assert "generation 2" in edited.events[0].message and "built from generation 1" in edited.events[0].message
    _assert_stable(job, edited, built_from_1, gen=2)  # said once per edit
    again = _step(job, edited.status, built_from_1, gen=3)
    assert _reasons(again) == ["SpecChangePending"]  # a second edit is a second notice
    # the next gang is built from the spec it runs with: the condition clears
    taken = _step(job, again.status, [_pod(r, gen=1, spec_generation=3) for r in range(WORLD)], gen=3)
    assert _cond(taken.status, "SpecChangePending") == ("False", "Applied") and taken.events == []
