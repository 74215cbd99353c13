"""``files:<dir>``: FillJob manifests in a directory, with per-job status files beside them (``pipefill local``).

* ``<dir>/*.yaml`` (or ``.yml``): FillJob manifests, validated as admission would; other kinds are ignored.
  Relative ``output``/``input`` paths are taken relative to the executor's working directory, as in a container.
* ``<dir>/<job>.status.json``: the job's status (the FillJob status fields, camelCase), written atomically by the
  executor that holds the job. A job whose status says Succeeded, Failed or Cancelled is not offered again.
* ``<dir>/<job>.lock``: ownership. Several executors (ranks) may share the directory; the one that holds an exclusive
  ``flock`` on this file runs the job. The kernel releases the lock when the process dies, so a crashed executor's
  job is taken over (by its restart or another rank), which then recovers the job's output directory.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

from pipefill import env
from pipefill.spec import FillJob, FillJobPhase, SpecError, load_file, to_obj
from pipefill_fill.atomic import atomic_write_bytes
from pipefill_fill.sources.base import Identity, ProgressReport, WorkSource, status_from_report
from pipefill_fill.task import TaskSpec

__all__ = ["FilesSource"]

log = logging.getLogger("pipefill_fill")

_FINAL = {FillJobPhase.SUCCEEDED.value, FillJobPhase.FAILED.value, FillJobPhase.CANCELLED.value}


class FilesSource(WorkSource):
    def __init__(self, directory: Path, *, identity: Identity, base_dir: Path | None = None) -> None:
        if not directory.is_dir():
            raise ValueError(f"{env.WORK_SOURCE}=files:{directory}: not a directory; create it or fix the path")
        self.dir = directory
        self.identity = identity
        self.base_dir = base_dir or Path.cwd()
        self._locks: dict[str, int] = {}
        self._bad: set[tuple[str, float]] = set()

    def poll(self) -> list[TaskSpec]:
        specs = []
        for path in sorted([*self.dir.glob("*.yaml"), *self.dir.glob("*.yml")]):
            for job in self._load(path):
                labels = self.identity.labels
                if labels is not None and not job.spec.host_selector.matches(labels):
                    continue
                if self._status(job.name).get("phase") in _FINAL:
                    continue
                specs.append(TaskSpec.from_spec(job, base_dir=self.base_dir))
        return sorted(specs, key=lambda s: (-s.priority, s.name))

    def acquire(self, name: str) -> bool:
        if name in self._locks:
            return True
        fd = os.open(self.dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{self.identity.training_job} rank {self.identity.rank} pid {os.getpid()}\n".encode())
        self._locks[name] = fd
        return True

    def release(self, name: str) -> None:
        fd = self._locks.pop(name, None)
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the flock

    def report(self, name: str, report: ProgressReport) -> None:
        status = to_obj(status_from_report(report, self.identity))
        if report.message:
            status["message"] = report.message
        atomic_write_bytes(
            self.dir / f"{name}.status.json", (json.dumps(status, indent=2) + "\n").encode(), durable=False
        )

    def close(self) -> None:
        for name in list(self._locks):
            self.release(name)

    def status(self, name: str) -> dict[str, Any]:
        """The last status written for ``name`` (empty when none)."""
        return self._status(name)

    def _status(self, name: str) -> dict[str, Any]:
        path = self.dir / f"{name}.status.json"
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return data

    def _load(self, path: Path) -> list[FillJob]:
        key = (str(path), path.stat().st_mtime)
        if key in self._bad:
            return []
        try:
            return [m for m in load_file(path) if isinstance(m, FillJob)]
        except (SpecError, ValueError) as exc:
            self._bad.add(key)  # log once per version of the file
            log.error("work source: %s is not a valid manifest, skipped: %s", path, exc)
            return []
