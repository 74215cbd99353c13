"""``files:<dir>``: FillJob manifests in a directory, with per-job status files beside them (``pipefill local``).

* ``<dir>/*.yaml`` (or ``.yml``): FillJob manifests, validated as admission would; other kinds are ignored.
  Relative ``output``/``input`` paths are taken relative to the executor's working directory, as in a container.
* ``<dir>/<job>.status.json``: the job's status (the FillJob status fields, camelCase). This source plays the
  operator's part here: it writes the plan of record (``slices``, :func:`pipefill.queue.plan_slices`) when it first
  sees the job, and one assignment per executor working on the job (training job, rank, slice, epoch: a claim takes
  the next ``epoch``); the executors advance each slice's ``committed``, ``samplesDone`` is their sum. Every executor that works on the
  job writes it: read, merge (:func:`merged_status`), write atomically, all under ``<job>.locks/status.lock``, so
  concurrent writers lose no update. A job whose status says Succeeded, Failed or Cancelled is not offered again.
* ``<dir>/<job>.locks/``: ownership, by exclusive ``flock``s. ``seat-<i>.lock`` (i < maxParallelRanks; one for a job
  that is not split): an executor holds a seat while it holds slices of the job, so at most maxParallelRanks work on
  it at once. ``slice-<start>-<end>.lock``: the executor that holds it runs that slice. The kernel drops the locks
  when the process dies, so a crashed executor's seat and slice are taken over at once (by its restart or another
  rank), which then recovers the slice's store. Each lock file names its last holder, for people.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipefill import env
from pipefill.queue.slices import plan_slices
from pipefill.queue.status import output_report, plan_of_record
from pipefill.spec import FillJob, SpecError, load_file
from pipefill.spec.fillstatus import Assignment
from pipefill_fill.atomic import atomic_write_bytes
from pipefill_fill.locks import locked, try_lock, unlock
from pipefill_fill.sources.base import FINAL_PHASES, Identity, ProgressReport, WorkSource, merged_status
from pipefill_fill.work import Slice, TaskSpec

__all__ = ["FilesSource"]

log = logging.getLogger("pipefill_fill")


class FilesSource(WorkSource):
    def __init__(self, directory: Path, *, identity: Identity, base_dir: Path | None = None) -> None:
        if not directory.is_dir():
            raise ValueError(f"{env.WORK_SOURCE}=files:{directory}: not a directory; create it or fix the path")
        self.dir = directory
        self.identity = identity
        self.base_dir = base_dir or Path.cwd()
        self._seats: dict[str, int] = {}  # job -> descriptor of the seat lock this executor holds
        self._slices: dict[str, dict[Slice, int]] = {}  # job -> slice -> descriptor of its lock
        self._epochs: dict[tuple[str, Slice], int] = {}  # the epoch each held slice was claimed at
        self._holder = f"{identity.training_job} rank {identity.rank} pid {os.getpid()}"
        self._bad: set[tuple[str, float]] = set()
        self._parsed: dict[str, tuple[tuple[int, ...], list[FillJob]]] = {}  # path -> (version, its FillJobs)
        self._polled: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}  # job -> (version, status)

    def poll(self) -> list[TaskSpec]:
        specs = []
        for path in self._manifests():
            for job in self._load(path):
                labels = self.identity.labels
                if labels is not None and not job.spec.host_selector.matches(labels):
                    continue
                status = self._polled_status(job.name, self._status_version(job.name))
                if status.get("phase") in FINAL_PHASES:
                    continue
                spec = TaskSpec.from_spec(job, base_dir=self.base_dir)
                try:
                    specs.append(dataclasses.replace(spec, plan=self._plan_of_record(spec, status)))
                except ValueError as exc:
                    log.error("work source: %s", exc)
        return sorted(specs, key=lambda s: (-s.priority, s.name))

    def _plan_of_record(self, spec: TaskSpec, polled: dict[str, Any]) -> tuple[Slice, ...]:
        """The job's ``status.slices``, written here once when the job is first seen (this source plays the
        operator's part): :func:`pipefill.queue.plan_slices`, or the bounds its output directory already records
        (a status file removed by hand, a directory from before slices). ``polled``: the status this poll read (a plan
        of record never changes once written, so only a status without one is read again, under its lock)."""
        recorded = plan_of_record(polled)
        if recorded:
            return recorded
        with locked(self._lock_dir(spec.name) / "status.lock"):
            status = self._status(spec.name)
            recorded = plan_of_record(status)
            if not recorded:
                recorded = tuple(
                    _stored_plan(spec)
                    or plan_slices(spec.total, parallel_ranks=spec.parallel_ranks, min_units=spec.min_slice_units)
                )
                status["slices"] = [{"start": s.start, "end": s.end, "committed": s.start} for s in recorded]
                status["output"] = output_report(path=str(spec.output_dir), claim_name=None, kind=spec.kind)
                self._write_status(spec.name, status)
        return recorded

    def claim(self, spec: TaskSpec, slices: Sequence[Slice]) -> Slice | None:
        held = self._slices.setdefault(spec.name, {})
        mine = next((s for s in slices if s in held), None)
        if mine is not None or not slices:
            return mine
        if spec.name not in self._seats:
            for i in range(spec.parallel_ranks):
                fd = try_lock(self._lock_dir(spec.name) / f"seat-{i}.lock", holder=self._holder)
                if fd is not None:
                    self._seats[spec.name] = fd
                    break
            else:
                return None  # maxParallelRanks executors work on the job already
        for s in slices:
            fd = try_lock(self._lock_dir(spec.name) / f"slice-{s.key}.lock", holder=self._holder)
            if fd is not None:
                held[s] = fd
                self._epochs[(spec.name, s)] = self._next_epoch(spec.name)
                return s
        if not held:
            unlock(self._seats.pop(spec.name))
        return None

    def epoch(self, name: str, slice: Slice) -> int:
        return self._epochs.get((name, slice), 0)

    def revoked(self, name: str, slice: Slice, epoch: int) -> str | None:
        # The slice's flock is the assignment here: held by this process until it releases it or dies.
        if slice not in self._slices.get(name, {}) or self._epochs.get((name, slice)) != epoch:
            return f"this executor no longer holds the slice at epoch {epoch}"
        return None

    def _next_epoch(self, name: str) -> int:
        """A new placement of one of the job's slices: ``status.epoch`` + 1, recorded (the operator's part)."""
        with locked(self._lock_dir(name) / "status.lock"):
            status = self._status(name)
            status["epoch"] = int(status.get("epoch") or 0) + 1
            self._write_status(name, status)
        return int(status["epoch"])

    def release(self, name: str, slice: Slice | None = None) -> None:
        held = self._slices.get(name, {})
        for s in [s for s in held if slice is None or s == slice]:
            self._epochs.pop((name, s), None)
            unlock(held.pop(s))
        if not held and name in self._seats:
            unlock(self._seats.pop(name))

    def report(self, name: str, report: ProgressReport) -> None:
        with locked(self._lock_dir(name) / "status.lock"):
            me = self.identity
            held = [
                Assignment(me.training_job, me.rank, s.start, s.end, me.pod, me.pod_uid, self._epochs.get((name, s)))
                for s in sorted(self._slices.get(name, {}))
            ]
            status = merged_status(self._status(name), report, identity=me, held=held)
            if status is not None:
                self._write_status(name, status)

    def _write_status(self, name: str, status: dict[str, Any]) -> None:
        data = (json.dumps(status, indent=2) + "\n").encode()
        atomic_write_bytes(self.dir / f"{name}.status.json", data, durable=False)

    def close(self) -> None:
        for name in list(self._slices):
            self.release(name)

    def status(self, name: str) -> dict[str, Any]:
        """The last status written for ``name`` (empty when none)."""
        return self._status(name)

    def _manifests(self) -> list[str]:
        """The paths of the directory's manifests (``*.yaml``, ``*.yml``) by name: one listing, no pattern matching
        and no path objects per entry (a poll of a queue of 100 jobs lists some 300 entries, several times a
        second)."""
        return [os.path.join(self.dir, n) for n in sorted(os.listdir(self.dir)) if n.endswith((".yaml", ".yml"))]

    def _status_version(self, name: str) -> tuple[int, ...] | None:
        """The version of ``name``'s status file (:func:`_version`); None: it has none."""
        try:
            return _version(os.stat(os.path.join(self.dir, f"{name}.status.json")))
        except FileNotFoundError:
            return None

    def _polled_status(self, name: str, version: tuple[int, ...] | None) -> dict[str, Any]:
        """:meth:`_status` for a poll (read only), at ``version`` (:meth:`_status_version`; None: no file): read and
        parsed again only where the file changed. A poll reads every job's status, and a queue of 100 jobs is polled
        several times a second (every status write wakes it): 1.5 s of an executor's CPU in 20 s beside the
        training. Every write replaces the file (a new inode); a commit's check (:meth:`revoked`) and a report read the
        file itself."""
        if version is None:
            return {}
        known = self._polled.get(name)
        if known is None or known[0] != version:  # read after the stat: a newer file is cached under the older
            known = self._polled[name] = (version, self._status(name))  # version, so it is read again next time
        return known[1]

    def _status(self, name: str) -> dict[str, Any]:
        path = self.dir / f"{name}.status.json"
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return data

    def _lock_dir(self, name: str) -> Path:
        return self.dir / f"{name}.locks"

    def _load(self, path: str) -> list[FillJob]:
        st = os.stat(path)
        key = (path, st.st_mtime)
        if key in self._bad:
            return []
        version = _version(st)
        known = self._parsed.get(path)
        if known is not None and known[0] == version:  # parsed and validated already: a poll at every job switch
            return known[1]  # costs a stat per manifest, not a parse (10 ms each, 0.2 s for 20 jobs)
        try:
            jobs = [m for m in load_file(Path(path)) if isinstance(m, FillJob)]
            self._parsed[path] = (version, jobs)
            return jobs
        except (SpecError, ValueError) as exc:
            self._bad.add(key)  # log once per version of the file
            log.error("work source: %s is not a valid manifest, skipped: %s", path, exc)
            return []


def _version(st: os.stat_result) -> tuple[int, ...]:
    """What tells one version of a file from the next: every write here replaces it (a new inode)."""
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


def _stored_plan(spec: TaskSpec) -> list[Slice]:
    """The slices the job's output directory records (``slices.json``; one slice for a directory from before slices
    existed); empty when it records none."""
    try:
        bounds = [int(b) for b in json.loads((spec.output_dir / "slices.json").read_text())["bounds"]]
    except FileNotFoundError:
        return [Slice(0, spec.total)] if (spec.output_dir / "progress.json").exists() else []
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"FillJob {spec.name}: {spec.output_dir / 'slices.json'} is not readable ({exc})") from exc
    return [Slice(a, b) for a, b in itertools.pairwise(bounds)]
