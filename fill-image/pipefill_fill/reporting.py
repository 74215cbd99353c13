"""What an executor tells of a job: to its work source, the progress as the job's storage has it (every slice's commit
pointer), with the phase and the fields a report may carry; to its event log, each commit."""

from __future__ import annotations

from typing import TypedDict, Unpack

from pipefill.events import CommitEvent
from pipefill.spec import FillJobPhase
from pipefill.spec.fillstatus import SliceProgress
from pipefill_fill.active import ActiveJob
from pipefill_fill.slices import JobDir
from pipefill_fill.sources import ProgressReport
from pipefill_fill.task import TaskSpec

__all__ = ["ReportFields", "commit_event", "progress_report"]


class ReportFields(TypedDict, total=False):
    """The optional fields of a progress report."""

    committed: int | None  # units done; None: as the storage has them
    rate: float | None  # units a second lately
    message: str
    start_time: str | None
    completion_time: str | None


def progress_report(spec: TaskSpec, job: JobDir, phase: FillJobPhase, **fields: Unpack[ReportFields]) -> ProgressReport:
    """A report with every slice's commit pointer as the job's storage has it."""
    states = job.states()
    pointers = tuple(SliceProgress(st.slice.start, st.slice.end, st.committed) for st in states)
    committed = fields.get("committed")
    done = sum(st.units for st in states) if committed is None else committed
    return ProgressReport(
        phase,
        done,
        spec.total,
        fields.get("rate"),
        fields.get("message", ""),
        fields.get("start_time"),
        fields.get("completion_time"),
        slices=pointers,
    )


def commit_event(
    a: ActiveJob, committed: int, *, written: int, commit_s: float, write_s: float = 0.0, at: str = ""
) -> CommitEvent:
    """The event of a commit of ``a``'s slice: ``committed`` units of the job durable."""
    return CommitEvent(
        job=a.name,
        end=committed,
        slice=[a.slice.start, a.slice.end],
        position=a.task.committed,
        bytes=written,
        commit_s=commit_s,
        write_s=write_s,
        at=at or None,
    )
