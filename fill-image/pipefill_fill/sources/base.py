"""Work sources: where the fill executor learns which FillJobs to run, claims slices of them, and reports progress.

Two implementations share this interface: ``files:<dir>`` (a directory of FillJob manifests, used by ``pipefill local``)
and ``kubernetes`` (FillJob objects the operator assigned to this pod). The executor only ever calls these methods.

A job's units of work are divided into slices (:mod:`pipefill_fill.slices`). An executor works on one slice of a job at
a time: it asks :meth:`WorkSource.claim` for one of the job's unfinished slices, runs it, releases it, and claims the
next. The source decides who may hold what: at most ``spec.maxParallelRanks`` executors hold slices of one job at once,
and a slice has one holder; a holder that dies loses its claim (files: the kernel drops its locks; Kubernetes: the
operator moves the assignment), and the next holder recovers the slice's store and goes on from its last commit.

The source also says which epoch of a slice's assignment this executor holds and whether it is still current
(:meth:`WorkSource.epoch`, :meth:`WorkSource.revoked`): the slice's store checks both at every commit, so an executor
whose slice moved writes nothing more (:mod:`pipefill_fill.store`).

Each executor reports the job's progress as it reads it from the job's output directory (every slice's commit
pointer: the truth, shared by all), so a report from any executor is right for the whole job; the source merges it
into the status others write too (:func:`merged_status`), under a lock (files) or a resourceVersion precondition
(Kubernetes), so no concurrent update is lost and progress never goes backwards.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from typing import Any

from pipefill.queue.status import FINAL_PHASES, Identity, ProgressReport, merged_status, now_rfc3339, plan_of_record
from pipefill.spec import FillJob
from pipefill_fill.work import Slice, TaskSpec

__all__ = [
    "FINAL_PHASES",
    "FollowsAssignments",
    "Identity",
    "ProgressReport",
    "WorkSource",
    "assigned_here",
    "assignment_gone",
    "merged_status",
    "now_rfc3339",
]

log = logging.getLogger("pipefill_fill")


class FollowsAssignments:
    """Claims of a source whose assignments a queue writes (the operator's, or ``pipefill local``'s): a slice is
    this executor's while an assignment with its epoch names it; ``poll`` fills ``_assigned`` as it last read them."""

    def __init__(self) -> None:
        self._assigned: dict[str, dict[Slice, int]] = {}  # job -> slice -> epoch assigned here, as last polled
        self._held: dict[tuple[str, Slice], int] = {}  # slices claimed, with the epoch they were claimed at
        self._said: dict[str, tuple[tuple[Slice, ...], tuple[Slice, ...]]] = {}  # job -> the mismatch last logged

    def claim(self, spec: TaskSpec, slices: Sequence[Slice]) -> Slice | None:
        mine = self._assigned.get(spec.name, {})
        found = next((s for s in slices if s in mine), None)
        said = (tuple(mine), tuple(slices)) if found is None and mine else None
        if said is not None and self._said.get(spec.name) != said:  # once, not at every poll until it changes
            log.info(
                "work source: FillJob %s: the slices assigned here (%s) are none of its unfinished ones (%s)",
                spec.name,
                ", ".join(map(str, mine)),
                ", ".join(map(str, slices)),
            )
        if said is None:
            self._said.pop(spec.name, None)
        else:
            self._said[spec.name] = said
        if found is not None:
            self._held[(spec.name, found)] = mine[found]
        return found

    def epoch(self, name: str, slice: Slice) -> int:
        return self._held.get((name, slice), 0)

    @staticmethod
    def offer(
        job: FillJob, status: dict[str, Any], identity: Identity, *, into: list[TaskSpec], **paths: Any
    ) -> dict[Slice, int]:
        """The slices of ``job`` assigned here, its task added to ``into``; none (nothing added) when it is final,
        cancelled or suspended, has no plan of record yet (the queue has not scheduled it) or its spec is unusable
        (logged). ``paths``: TaskSpec.from_spec's, where the source keeps the jobs' files."""
        mine, plan = assigned_here(status, identity), plan_of_record(status)
        if status.get("phase") in FINAL_PHASES or job.spec.cancel or job.spec.suspend or not mine or not plan:
            return {}
        try:
            into.append(TaskSpec.from_spec(job, plan=plan, **paths))
        except ValueError as exc:
            log.error("work source: %s", exc)
            return {}
        return mine

    def release(self, name: str, slice: Slice | None = None) -> None:
        for key in [k for k in self._held if k[0] == name and (slice is None or k[1] == slice)]:
            del self._held[key]  # the queue moves assignments; this only forgets the claim


def assigned_here(status: dict[str, Any], identity: Identity) -> dict[Slice, int]:
    """The slices ``status.assignments`` gives this executor, with their epochs: by its pod's uid, or (no uid:
    outside a pod) by training job and rank."""
    out = {}
    for a in status.get("assignments") or []:
        if identity.pod_uid is not None:
            if a.get("podUID") != identity.pod_uid:
                continue
        elif (a.get("trainingJob"), a.get("rank")) != (identity.training_job, identity.rank):
            continue
        try:
            out[Slice(int(a.get("start", 0)), int(a.get("end", 0)))] = int(a.get("epoch") or 0)
        except ValueError as exc:
            log.error("work source: assignment %s: %s", a, exc)
    return out


def assignment_gone(obj: dict[str, Any] | None, identity: Identity, slice: Slice, epoch: int) -> str | None:
    """Why this executor may no longer commit ``slice`` at ``epoch`` of the FillJob ``obj`` (spec and status, as last
    read; None: deleted), or None while that very assignment is in its status."""
    if obj is None:
        return "the FillJob was deleted"
    status, spec = obj.get("status") or {}, obj.get("spec") or {}
    if spec.get("cancel"):
        return "the FillJob was cancelled (spec.cancel)"
    if status.get("phase") in FINAL_PHASES:
        return f"the FillJob is {status['phase']}"
    if assigned_here(status, identity).get(slice) == epoch:
        return None
    now = [a for a in status.get("assignments") or [] if (a.get("start"), a.get("end")) == (slice.start, slice.end)]
    where = ", ".join(f"epoch {a.get('epoch')} on pod {a.get('pod') or a.get('podUID')}" for a in now)
    return f"its assignment at epoch {epoch} is gone ({'now ' + where if where else 'unassigned'})"


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

    def epoch(self, name: str, slice: Slice) -> int:
        """The epoch of this executor's assignment of ``slice`` (held: :meth:`claim` returned it); the store records
        it and refuses commits of an older one (:class:`pipefill_fill.store.Superseded`)."""
        return 0

    def revoked(self, name: str, slice: Slice, epoch: int) -> str | None:
        """Why this executor may no longer commit ``slice`` of job ``name`` at ``epoch`` (the assignment moved, was
        removed, or the job was cancelled), as the source knows now without a request; None: it may. Called under
        the slice's commit lock at every commit."""
        return None

    def changed(self) -> bool:
        """Whether the jobs or their assignments may have changed since :meth:`poll` (cheap; checked after every
        bubble, so a cancelled job stops at the next one)."""
        return False

    def acquire(self, name: str) -> bool:
        """Take job ``name`` whole, as one slice ``[0, total)``: for runners that do not split a job."""
        spec = next((s for s in self.poll() if s.name == name), None)
        return spec is not None and self.claim(spec, [Slice(0, spec.total)]) is not None

    def close(self) -> None:
        """Release everything; the default does nothing."""
        return None
