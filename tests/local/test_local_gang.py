"""`pipefill local` decides with the operator's core: processes observed as pods, the core's decision applied to them.

The sidecar rule (when a fill executor that exited starts again) is the core's too; the processes here are tiny shell
commands standing in for trainers and fill executors, so every transition is real process handling, without torch.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import pytest
from manifests import training_job

from pipefill.events import EventWriter, ExitEvent
from pipefill.lifecycle import Decision, FillExit, Observed, PodView, Termination, decide
from pipefill.lifecycle.sidecars import FILL_RESTART_BACKOFF_S, fill_restarts_due
from pipefill.local.adapter import LocalGang
from pipefill.local.procs import LocalProcess
from pipefill.local.report import rank_log_paths
from pipefill.spec import JobPhase, PipelineTrainingJob, PipelineTrainingJobStatus, parse

T0 = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)


def _job(**run_policy: object) -> PipelineTrainingJob:
    job = parse(training_job(runPolicy=run_policy))
    assert isinstance(job, PipelineTrainingJob)
    return job


def _pod(rank: int, **kw: object) -> PodView:
    fields: dict[str, object] = {"name": f"j-{rank}", "rank": rank, "generation": 0, "phase": "Running"}
    fields.update(deleting=False, trainer_running=True)
    fields.update(kw)
    return PodView(**fields)  # type: ignore[arg-type]


def test_an_exited_fill_executor_starts_again_after_its_backoff_unless_its_trainer_ended_or_left_it() -> None:
    crashed = FillExit(137, T0)
    pods = [_pod(0, fill_exit=crashed, fill_restarts=2), _pod(1)]
    assert fill_restarts_due(pods, T0) == ([], FILL_RESTART_BACKOFF_S[2])
    assert fill_restarts_due(pods, T0 + datetime.timedelta(seconds=FILL_RESTART_BACKOFF_S[2])) == ([0], None)
    later = T0 + datetime.timedelta(hours=1)
    gone = FillExit(0, T0, left_with_trainer=True)  # its trainer stopped announcing: the job restart starts it
    assert fill_restarts_due([_pod(0, fill_exit=gone)], later) == ([], None)
    done = Termination(0, "Completed", "")  # its trainer ended: so did its pod's sidecars
    assert fill_restarts_due([_pod(0, fill_exit=crashed, trainer=done, trainer_running=False)], later) == ([], None)


def test_the_core_decides_the_fill_restart_and_reports_it_with_the_last_exit_as_on_a_cluster() -> None:
    job = _job()
    first = decide(job, PipelineTrainingJobStatus(), Observed(pods=[], now=T0), job_generation=1)
    running = decide(job, first.status, Observed(pods=[_pod(0), _pod(1)], now=T0), job_generation=1).status
    waiting = Observed(pods=[_pod(0, fill_exit=FillExit(1, T0)), _pod(1)], now=T0)
    d = decide(job, running, waiting, job_generation=1)
    assert d.restart_fill == [] and d.requeue_after_s == FILL_RESTART_BACKOFF_S[0] and d.events == []
    due = Observed(pods=waiting.pods, now=T0 + datetime.timedelta(seconds=1))
    d = decide(job, running, due, job_generation=1)
    assert d.restart_fill == [0] and d.status.phase == JobPhase.RUNNING
    again = Observed(pods=[_pod(0, fill_restarts=1, fill_last_exit=1), _pod(1)], now=T0)
    (event,) = decide(job, d.status, again, job_generation=1).events
    assert (event.reason, event.message) == (
        "FillExecutorRestarted",
        "fill-executor sidecars restarted (rank 0: 1, last exited with code 1); training goes on",
    )


def _proc(tmp: Path, rank: int, container: str, script: str) -> LocalProcess:
    argv = [sys.executable, "-c", script]
    return LocalProcess(rank, container, argv, {}, tmp / "ranks" / str(rank) / container, 0)


class _Scripts:
    """What each generation's processes do: trainers by generation (rank 1's first one fails with ``code``)."""

    def __init__(self, tmp: Path, *, code: int) -> None:
        self.tmp, self.code, self.spawned = tmp, code, 0

    def __call__(self) -> list[LocalProcess]:
        generation, self.spawned = self.spawned, self.spawned + 1
        out = []
        for rank in (0, 1):
            fails = generation == 0 and rank == 1
            trainer = f"import sys, time; print('rank {rank} says goodbye'); time.sleep(0.3); sys.exit({self.code if fails else 0})"
            out.append(_proc(self.tmp, rank, "fill-executor", "import time; time.sleep(60)"))
            out.append(_proc(self.tmp, rank, "trainer", trainer))
        return out


def _run(
    job: PipelineTrainingJob, tmp: Path, *, code: int, timeout_s: float = 30.0
) -> tuple[list[Decision], LocalGang]:
    """The runner's loop over processes whose first rank 1 exits with ``code``: observe, decide, apply, until the
    job ends; the decisions, and the gang (stopped)."""
    gang = LocalGang(job, out_dir=tmp, spawn=_Scripts(tmp, code=code))
    status, decisions = PipelineTrainingJobStatus(), []
    deadline = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=timeout_s)
    try:
        while status.phase not in (JobPhase.SUCCEEDED, JobPhase.FAILED):
            now = datetime.datetime.now(datetime.UTC)
            assert now < deadline, f"the job did not end: {status}"
            decision = decide(job, status, Observed(pods=gang.views(now), now=now), job_generation=1)
            gang.apply(decision)
            status = decision.status
            decisions.append(decision)
    finally:
        gang.stop()
    return decisions, gang


def test_a_retryable_trainer_exit_restarts_the_gang_as_the_next_generation(tmp_path: Path) -> None:
    decisions, _ = _run(_job(), tmp_path, code=75)
    status = decisions[-1].status
    assert (status.phase, status.generation, status.restarts) == (JobPhase.SUCCEEDED, 1, 1)
    reasons = [e.reason for d in decisions for e in d.events]
    # a new job's first gang has no PodsCreated or Running Event (its conditions tell it; #29), a restart's has both
    assert reasons == ["TrainerFailed", "PodsCreated", "Running", "TrainingFinished"]
    failed = next(e for d in decisions for e in d.events if e.reason == "TrainerFailed")
    assert failed.message.startswith("rank 1 (pod j-1): trainer exited with code 75: rank 1 says goodbye; restarting")
    assert sorted(d.delete_pods for d in decisions if d.delete_pods)[0] == ["j-0", "j-1"]


def test_a_permanent_trainer_exit_fails_the_job_and_stops_its_pods(tmp_path: Path) -> None:
    decisions, gang = _run(_job(restartOnExitCodes=[75]), tmp_path, code=3)
    status = decisions[-1].status
    assert (status.phase, status.restarts) == (JobPhase.FAILED, 0)
    assert decisions[-1].events[-1].reason == "TrainerFailed"
    assert "trainer exited with code 3" in decisions[-1].events[-1].message
    assert all(p.poll() is not None for p in gang.procs)


@pytest.mark.parametrize("trainer_gone", [False, True])
def test_a_fill_executor_that_exits_is_restarted_by_the_adapter_unless_its_trainer_is_gone(
    tmp_path: Path, trainer_gone: bool
) -> None:
    job = _job()
    exits = "import sys; sys.exit(0)" if trainer_gone else "import sys; sys.exit(1)"
    if trainer_gone:  # its exit record says why it left, as the executor writes it
        with EventWriter(rank_log_paths(tmp_path, 0)[1]) as log:
            log.write(ExitEvent(reason="trainer gone"))

    def spawn() -> list[LocalProcess]:
        return [
            _proc(tmp_path, 0, "fill-executor", exits),
            _proc(tmp_path, 0, "trainer", "import time; time.sleep(60)"),
            _proc(tmp_path, 1, "trainer", "import time; time.sleep(60)"),
        ]

    gang = LocalGang(job, out_dir=tmp_path, spawn=spawn)
    status, restarted = PipelineTrainingJobStatus(), []
    start = now = datetime.datetime.now(datetime.UTC)
    exited: datetime.datetime | None = None
    # decided until the restart, or (trainer gone) until the backoff it would have waited has passed twice
    while not restarted and (exited is None or (now - exited).total_seconds() < 2 * FILL_RESTART_BACKOFF_S[0]):
        now = datetime.datetime.now(datetime.UTC)
        assert (now - start).total_seconds() < 20, f"nothing decided: {status}"
        views = gang.views(now)
        exited = exited or next((v.fill_exit.at for v in views if v.fill_exit is not None), None)
        decision = decide(job, status, Observed(pods=views, now=now), job_generation=1)
        gang.apply(decision)
        status, restarted = decision.status, restarted + decision.restart_fill
    gang.stop()
    assert status.phase == JobPhase.RUNNING
    if trainer_gone:
        assert restarted == [] and gang.restarts == {}
    else:
        assert restarted == [0] and gang.restarts == {(0, "fill-executor"): 1}
