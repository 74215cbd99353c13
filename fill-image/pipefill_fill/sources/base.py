"""Work sources: where the fill executor learns which FillJobs to run, claims slices of them, and reports progress.

Two implementations share this interface: ``files:<dir>`` (a directory of FillJob manifests, used by ``pipefill local``)
and ``kubernetes`` (FillJob objects the operator assigned to this pod). The executor only ever calls these methods.

A job's units of work are divided into slices (:mod:`pipefill_fill.slices`). An executor works on one slice of a job at
a time: it asks :meth:`WorkSource.claim` for one of the job's unfinished slices, runs it, releases it, and claims the
next. The source decides who may hold what: at most ``spec.maxParallelRanks`` executors hold slices of one job at once,
and a slice has one holder; a holder that dies loses its claim (files: the kernel drops its locks; Kubernetes: the
operator moves the assignment), and the next holder recovers the slice's store and goes on from its last commit.

Each executor reports the job's progress as it reads it from the job's output directory (every slice's commit
pointer: the truth, shared by all), so a report from any executor is right for the whole job; the source merges it
into the status others write too (:func:`merged_status`), under a lock (files) or a resourceVersion precondition
(Kubernetes), so no concurrent update is lost and progress never goes backwards.
"""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipefill.spec import FillJobPhase, FillJobStatus, to_obj
from pipefill.spec.filljob import Assignment
from pipefill_fill.work import Slice, TaskSpec

__all__ = ["FINAL_PHASES", "Identity", "ProgressReport", "WorkSource", "merged_status", "now_rfc3339"]

FINAL_PHASES = frozenset({FillJobPhase.SUCCEEDED.value, FillJobPhase.FAILED.value, FillJobPhase.CANCELLED.value})


@dataclass(frozen=True)
class Identity:
    """Who is asking: the PipelineTrainingJob, this pod's rank, and the training job's labels for hostSelector
    (None: not known here; the queue was filtered for this host already, as ``pipefill local`` and the operator do)."""

    training_job: str
    rank: int
    labels: dict[str, str] | None = None


@dataclass(frozen=True)
class ProgressReport:
    """What an executor reports about a job after a commit or a phase change.

    ``committed``: units of work committed over all the job's slices (:meth:`pipefill_fill.slices.JobDir.committed`);
    ``throughput_per_s``: the job's committed units per second as this executor saw them grow (all ranks' work)."""

    phase: FillJobPhase
    committed: int
    total: int
    throughput_per_s: float | None = None
    message: str = ""
    start_time: str | None = None
    completion_time: str | None = None


class WorkSource(abc.ABC):
    """FillJobs assigned to this executor, the slices of them it holds, and their status."""

    @abc.abstractmethod
    def poll(self) -> list[TaskSpec]:
        """Jobs assigned to this executor that are not finished, highest priority first (then by name)."""

    @abc.abstractmethod
    def claim(self, spec: TaskSpec, slices: Sequence[Slice]) -> Slice | None:
        """Take one of ``slices`` (the job's unfinished slices, in order of preference) for this executor, or return
        the one of them it holds already; None when it may not now (another executor holds each of them, or
        ``maxParallelRanks`` executors work on the job already, or none of them is assigned here)."""

    @abc.abstractmethod
    def release(self, name: str, slice: Slice | None = None) -> None:
        """Give back ``slice`` of job ``name`` (None: everything this executor holds of the job)."""

    @abc.abstractmethod
    def report(self, name: str, report: ProgressReport) -> None:
        """Record the job's progress and phase where its owner sees it (status file or FillJob status)."""

    def acquire(self, name: str) -> bool:
        """Take job ``name`` whole, as one slice ``[0, total)``: for runners that do not split a job."""
        spec = next((s for s in self.poll() if s.name == name), None)
        return spec is not None and self.claim(spec, [Slice(0, spec.total)]) is not None

    def close(self) -> None:
        """Release everything; the default does nothing."""
        return None


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merged_status(
    old: dict[str, Any], report: ProgressReport, *, identity: Identity, held: Sequence[Slice] | None
) -> dict[str, Any] | None:
    """The job's status (camelCase FillJob status fields) after this executor's ``report``, from the status as it is
    now (``old``, written by any executor); None when the report changes nothing that may change.

    * A final phase (Succeeded, Failed, Cancelled) stays: a late report of another executor does not undo it.
    * ``samplesDone`` never decreases (committed work only grows; a report read before another's commit is older).
    * ``held``: the slices this executor holds now, which replace its assignments (by training job and rank) and any
      other assignment of the same slices (a slice taken over from a dead executor); None leaves assignments alone
      (the operator owns them). A final phase clears them: nothing runs any more.
    * Queued from this executor (no batch size fits its bubbles) while others hold slices stays Running.
    * ``startTime`` is the first one reported; ``throughput`` the latest reported while running.
    """
    old_phase = old.get("phase")
    if old_phase in FINAL_PHASES and old_phase != report.phase.value:
        return None
    assignments = [Assignment(**_snake(a)) for a in old.get("assignments") or []]
    if held is not None:
        mine = {(s.start, s.end) for s in held}
        assignments = [
            a
            for a in assignments
            if (a.training_job, a.rank) != (identity.training_job, identity.rank) and (a.start, a.end) not in mine
        ]
        assignments += [Assignment(identity.training_job, identity.rank, s.start, s.end) for s in sorted(held)]
    phase = report.phase
    if phase == FillJobPhase.QUEUED and assignments:
        phase = FillJobPhase.RUNNING
    if phase.value in FINAL_PHASES:
        assignments = []
    done = min(max(int(old.get("samplesDone") or 0), report.committed), report.total)
    throughput = report.throughput_per_s
    if throughput is None and phase == FillJobPhase.RUNNING:
        throughput = old.get("throughput")
    eta = None
    if throughput and phase == FillJobPhase.RUNNING:
        left_s = max(0, report.total - done) / throughput
        eta = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=left_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = to_obj(
        FillJobStatus(
            phase=phase,
            assignments=sorted(assignments, key=lambda a: (a.start, a.training_job, a.rank)),
            samples_done=done,
            progress=round(100.0 * done / report.total, 3) if report.total else 0.0,
            throughput=round(throughput, 6) if throughput is not None else None,
            estimated_completion_time=eta,
            start_time=old.get("startTime") or report.start_time,
            completion_time=report.completion_time or old.get("completionTime"),
        )
    )
    if report.message:
        status["message"] = report.message
    return status


def _snake(assignment: dict[str, Any]) -> dict[str, Any]:
    return {
        "training_job": assignment["trainingJob"],
        "rank": assignment["rank"],
        "start": assignment["start"],
        "end": assignment["end"],
    }
