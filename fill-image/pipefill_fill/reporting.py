"""What an executor tells of a job: to its work source, the progress as the job's storage has it (every slice's commit
pointer), with the phase and the fields a report may carry; to its event log, each commit and each release."""

from __future__ import annotations

import logging
from typing import TypedDict, Unpack

from pipefill.events import CommitEvent, EventWriter, JobEvent
from pipefill.spec import FillJobPhase
from pipefill.spec.fillstatus import SliceProgress
from pipefill_fill.active import ActiveJob
from pipefill_fill.commits import Pending
from pipefill_fill.slices import JobDir
from pipefill_fill.sources import ProgressReport
from pipefill_fill.task import TaskSpec

__all__ = ["ReportFields", "commit_event", "progress_report", "released", "written_event"]

log = logging.getLogger("pipefill_fill")


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


def written_event(a: ActiveJob, pending: Pending) -> CommitEvent:
    """The event of ``a``'s commit ``pending``, written: the job's progress as its storage has it now."""
    committed = a.job.committed()
    at = "between" if pending.between else ""
    return commit_event(a, committed, written=pending.written, commit_s=pending.stage_s, write_s=pending.write_s, at=at)


def released(a: ActiveJob, events: EventWriter, *, timeout_s: float | None = 0.0) -> bool:
    """Log the release of ``a``, a job let go of, once its commit in flight is settled (waiting at most ``timeout_s``):
    that commit's event, then ``Released`` with the pointer the storage keeps. The file part of a commit staged before
    the job was let go is still written (or refused, when its slice moved), so the pointer read before it lands would
    be stale. False while it is being written (nothing logged yet)."""
    try:
        pending = a.task.settle(timeout_s=timeout_s)
    except Exception as exc:  # refused (the slice moved) or the storage failed: it wrote nothing
        log.warning("job %s: its last commit, in flight when it was let go of, was not written: %s", a.name, exc)
        pending = None
    if a.task.inflight is not None:
        return False
    if pending is not None:
        events.write(written_event(a, pending))
    events.write(JobEvent(job=a.name, phase="Released", committed=a.job.committed(), total=a.spec.total))
    return True
