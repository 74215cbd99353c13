"""Work sources: where the fill executor learns which FillJobs to run and reports their progress.

Two implementations share this interface: ``files:<dir>`` (a directory of FillJob manifests, used by ``pipefill local``)
and ``kubernetes`` (FillJob objects the operator assigned to this pod). The executor only ever calls these methods.
"""

from __future__ import annotations

import abc
import datetime as dt
from dataclasses import dataclass

from pipefill.spec import FillJobPhase, FillJobStatus
from pipefill.spec.filljob import Assignment
from pipefill_fill.task import TaskSpec

__all__ = ["Identity", "ProgressReport", "WorkSource", "now_rfc3339", "status_from_report"]


@dataclass(frozen=True)
class Identity:
    """Who is asking: the PipelineTrainingJob, this pod's rank, and the training job's labels for hostSelector
    (None: not known here; the queue was filtered for this host already, as ``pipefill local`` and the operator do)."""

    training_job: str
    rank: int
    labels: dict[str, str] | None = None


@dataclass(frozen=True)
class ProgressReport:
    """What the executor reports about one job after a commit or a phase change."""

    phase: FillJobPhase
    committed: int
    total: int
    throughput_per_s: float | None = None
    message: str = ""
    start_time: str | None = None
    completion_time: str | None = None


class WorkSource(abc.ABC):
    """FillJobs assigned to this executor, and their status."""

    @abc.abstractmethod
    def poll(self) -> list[TaskSpec]:
        """Jobs assigned to this executor that are not finished, highest priority first (then by name)."""

    @abc.abstractmethod
    def acquire(self, name: str) -> bool:
        """Take the job for this executor; False when another executor holds it now (try again later)."""

    @abc.abstractmethod
    def release(self, name: str) -> None:
        """Give the job back (it finished, or this executor stops)."""

    @abc.abstractmethod
    def report(self, name: str, report: ProgressReport) -> None:
        """Record the job's progress and phase where its owner sees it (status file or FillJob status)."""

    def close(self) -> None:
        """Release everything; the default does nothing."""
        return None


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_from_report(report: ProgressReport, identity: Identity) -> FillJobStatus:
    """The FillJob status fields this executor owns, as the typed model."""
    progress = 100.0 * min(report.committed, report.total) / report.total if report.total else 0.0
    eta = None
    if report.throughput_per_s and report.phase == FillJobPhase.RUNNING:
        left_s = max(0, report.total - report.committed) / report.throughput_per_s
        eta = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=left_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return FillJobStatus(
        phase=report.phase,
        assignments=[Assignment(training_job=identity.training_job, rank=identity.rank, start=0, end=report.total)],
        samples_done=report.committed,
        progress=round(progress, 3),
        throughput=round(report.throughput_per_s, 6) if report.throughput_per_s is not None else None,
        estimated_completion_time=eta,
        start_time=report.start_time,
        completion_time=report.completion_time,
    )
