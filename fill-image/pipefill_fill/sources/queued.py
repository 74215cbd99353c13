"""``files:<dir>`` under a queue: the FillJob manifests of a directory whose assignments a scheduling pass writes.

``pipefill local`` runs the operator's queue (:mod:`pipefill.local.fillqueue`: :func:`pipefill.queue.schedule_pass`,
then :func:`pipefill.queue.outcome.decide`) over the directory and marks it with :data:`QUEUE_MARKER`. Each job's
``<job>.status.json`` then holds what the operator would write into its status: the plan of record, the assignments
with their epochs, the phase, the ``Scheduled`` condition. This source follows them as the ``kubernetes`` one follows
the FillJob objects: a job is offered while a slice of it is assigned to this executor (by ``PIPEFILL_POD_UID``, or
training job and rank), a claim takes an assigned slice at its epoch, a commit is refused once that assignment is gone
(:func:`assignment_gone`, read from the file at every commit), and a report writes only the executor's fields
(:func:`pipefill.queue.status.executor_patch`) under the file's lock. Where no queue runs (an executor started alone,
as the tests' harnesses do) :class:`~pipefill_fill.sources.files.FilesSource` shares the jobs by file locks instead.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from pipefill.queue.status import QUEUE_MARKER, executor_patch
from pipefill.spec import FillJob
from pipefill_fill.locks import locked
from pipefill_fill.sources.base import (
    FollowsAssignments,
    Identity,
    ProgressReport,
    assigned_here,
    assignment_gone,
)
from pipefill_fill.sources.files import FilesSource
from pipefill_fill.work import Slice, TaskSpec

__all__ = ["QUEUE_MARKER", "QueuedFilesSource"]

log = logging.getLogger("pipefill_fill")


@dataclass(frozen=True)
class _Offer:
    """What one job offered at a poll: its parsed manifest (the object the source keeps while the file is unchanged),
    the version of its status file then, the task it offered (none, or one) and the slices assigned here."""

    job: FillJob
    version: tuple[int, ...] | None
    specs: tuple[TaskSpec, ...]
    mine: dict[Slice, int]


class QueuedFilesSource(FollowsAssignments, FilesSource):
    def __init__(self, directory: Path, *, identity: Identity, base_dir: Path | None = None) -> None:
        FilesSource.__init__(self, directory, identity=identity, base_dir=base_dir)
        FollowsAssignments.__init__(self)
        self._seen_ns = 0  # the directory's mtime at the last poll (every status write replaces a file in it)
        self._cancelled: dict[str, bool] = {}  # every job assigned here at the last poll -> its spec.cancel
        self._offers: dict[str, _Offer] = {}  # every job assigned here at the last poll -> what it offered

    def poll(self) -> list[TaskSpec]:
        """The jobs with a slice assigned here. A job whose manifest and status file are the ones of the last poll
        offers what it offered then, unevaluated: a poll of a queue of 100 jobs, several times a second while the
        statuses change, evaluates only the jobs whose files changed (the rest costs a stat of each file). A manifest
        is parsed only once its job's status assigns it a slice here, as the ``kubernetes`` source parses only its
        own FillJobs: most jobs of a large queue are other executors' (parsing and validating each of 100 took 0.17 s
        of an executor's CPU at its first poll, in its first bubbles). The queue's directory holds each FillJob as
        ``<name>.yaml`` (pipefill local writes them so), beside its ``<name>.status.json``."""
        self._seen_ns = self._dir_mtime_ns()
        specs: list[TaskSpec] = []
        assigned, cancelled, offers = {}, {}, {}
        for path in self._manifests():
            stem = os.path.basename(path).rsplit(".", 1)[0]
            stem_version = self._status_version(stem)
            if not assigned_here(self._polled_status(stem, stem_version), self.identity):
                continue  # not parsed: not this executor's now
            for job in self._load(path):
                name = job.name
                cancelled[name] = job.spec.cancel
                version = stem_version if name == stem else self._status_version(name)
                known = self._offers.get(name)
                if known is None or known.job is not job or known.version != version:
                    added: list[TaskSpec] = []
                    status = self._polled_status(name, version)
                    mine = self.offer(job, status, self.identity, into=added, base_dir=self.base_dir)
                    known = _Offer(job, version, tuple(added), mine)
                offers[name] = known
                specs += known.specs
                if known.mine:
                    assigned[name] = known.mine
        self._assigned, self._cancelled, self._offers = assigned, cancelled, offers
        return sorted(specs, key=lambda s: (-s.priority, s.name))

    def changed(self) -> bool:
        return self._dir_mtime_ns() != self._seen_ns

    def revoked(self, name: str, slice: Slice, epoch: int) -> str | None:
        if name not in self._cancelled:
            return assignment_gone(None, self.identity, slice, epoch)
        obj = {"spec": {"cancel": self._cancelled[name]}, "status": self._status(name)}
        return assignment_gone(obj, self.identity, slice, epoch)

    def report(self, name: str, report: ProgressReport) -> None:
        with locked(self._lock_dir(name) / "status.lock"):
            old = self._status(name)
            patch = executor_patch(old, [report], identity=self.identity)
            if patch is not None:
                merged = {**old, **patch}
                self._write_status(name, {k: v for k, v in merged.items() if v is not None})

    def close(self) -> None:
        self._held.clear()

    def _dir_mtime_ns(self) -> int:
        try:
            return self.dir.stat().st_mtime_ns
        except OSError:
            return 0
