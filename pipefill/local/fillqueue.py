"""The FillJob queue of ``pipefill local``: the operator's scheduling pass over this run's FillJobs and ranks.

A pass reads each FillJob's status file (``<work>/<job>.status.json``), builds the :class:`~pipefill.queue.Snapshot`
the operator builds from its cache — the training job Running or not as its status says, one rank pod per rank of
the current generation, each rank's bubble classes as its executor reported them (:mod:`pipefill.queue.fromstatus`)
— runs :func:`pipefill.queue.schedule_pass` by the chosen policy, and writes what
:func:`pipefill.queue.outcome.decide` says into each status file: the plan of record, the assignments with their
epochs, the job's epoch, phase and message, the ``Scheduled`` condition with the reason a job waits. A file is
written under its lock and only when no executor wrote it since the pass read it (what the resourceVersion
precondition does on a cluster); the next pass decides again from the newer one. The executors follow the
assignments (``pipefill_fill.sources.queued``), so every policy, bubble-class fit, unfit report and reassignment
works here as on a cluster.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pipefill.lifecycle import PodView
from pipefill.local.adapter import pod_uid
from pipefill.queue import FillJobView, PassResult, RankView, Snapshot, TrainingJobView, now_rfc3339, schedule_pass
from pipefill.queue.fromstatus import reported_bubbles, status_fields
from pipefill.queue.outcome import decide
from pipefill.queue.status import QUEUE_MARKER
from pipefill.spec import FillJob, PipelineTrainingJob, to_obj

__all__ = ["LocalQueue"]

PERIOD_S = 1.0  # a pass at least this often when nothing changed (deadlines, jobs about to finish: decided by time)
_HELD_BACK = "Suspended"  # the phase the pass treats as inactive: its placements come back released
_FINAL = ("Succeeded", "Failed", "Cancelled")


def _namespace(obj: FillJob | PipelineTrainingJob) -> str:
    return str(obj.metadata.get("namespace") or "default")


def _parse(raw: bytes) -> dict[str, Any]:
    """A status file's object; {} for none, a torn or a foreign one."""
    try:
        data = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _unix_s(text: str | None) -> float | None:
    return None if not text else datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The status file's lock, the one the executors take (``pipefill_fill.locks.locked``: an exclusive flock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class LocalQueue:
    """One run's queue: ``fills`` in the order given (their creation order, for fifo and every tie-break)."""

    def __init__(
        self,
        job: PipelineTrainingJob,
        fills: Sequence[FillJob],
        work_dir: Path,
        *,
        policy: str = "fifo",
        max_jobs_per_rank: int,
        schedule_csv: str | None = None,
        period_s: float = PERIOD_S,
    ) -> None:
        self.job, self.fills, self.work_dir, self.period_s = job, list(fills), work_dir, period_s
        self.policy, self.max_jobs_per_rank, self.schedule_csv = policy, max_jobs_per_rank, schedule_csv
        self.last: PassResult | None = None
        # each FillJob as the API would return it, less its status: read once (a run never changes a spec), not at
        # every pass (with 100 FillJobs, converting them was half of a 19 ms pass, 5 passes a second)
        self._bodies = {
            f.name: {"metadata": {"namespace": _namespace(f), "name": f.name}, "spec": to_obj(f)["spec"]} for f in fills
        }
        # the inputs of the last pass (every status file's bytes, the pods, running) and when it ran: a pass on the
        # same inputs within period_s would decide the same, so it is not run (the operator's loop passes on events)
        self._inputs: tuple[Any, ...] | None = None
        self._passed_at = 0.0
        self._views: dict[str, tuple[bytes, FillJobView, dict[str, Any]]] = {}  # name -> (its file, its view, status)
        work_dir.mkdir(parents=True, exist_ok=True)
        (work_dir / QUEUE_MARKER).write_text(json.dumps({"policy": policy}) + "\n", encoding="utf-8")

    def _path(self, name: str) -> Path:
        return self.work_dir / f"{name}.status.json"

    def _raw(self, name: str) -> bytes:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            return b""

    def _read(self, name: str) -> dict[str, Any]:
        return _parse(self._raw(name))

    def _view(self, index: int, fill: FillJob, status: dict[str, Any]) -> FillJobView:
        phase = str(status.get("phase") or "Queued")
        if (fill.spec.suspend or fill.spec.cancel) and phase not in _FINAL:
            phase = _HELD_BACK  # it holds nothing: its placements come back released
        return FillJobView.from_spec(
            fill,
            namespace=_namespace(fill),
            created_unix_s=float(index),
            one_filesystem=True,  # every executor here writes under the same directories
            deadline_unix_s=_unix_s(fill.spec.deadline),
            phase=phase,
            epoch=int(status.get("epoch") or 0),
            **status_fields(fill.name, status),
        )

    def pass_once(self, pods: Sequence[PodView], *, running: bool) -> PassResult:
        """One pass over the FillJobs with the current generation's ``pods``; ``running``: the job's phase is
        Running (only then does it host fill work, as on a cluster)."""
        raws = {f.name: self._raw(f.name) for f in self.fills}
        inputs = (tuple(raws.values()), tuple(pods), running)
        if self.last is not None and inputs == self._inputs and time.monotonic() - self._passed_at < self.period_s:
            return self.last  # nothing changed since the last pass: it would decide the same
        for index, fill in enumerate(self.fills):  # parsed and viewed again only where its file changed
            if fill.name not in self._views or self._views[fill.name][0] != raws[fill.name]:
                status = _parse(raws[fill.name])
                self._views[fill.name] = (raws[fill.name], self._view(index, fill, status), status)
        statuses = {f.name: self._views[f.name][2] for f in self.fills}
        named = sorted(self.fills, key=lambda f: f.name)
        bubbles = reported_bubbles((_namespace(f), statuses[f.name]) for f in named)
        namespace = _namespace(self.job)
        ranks = tuple(
            RankView(
                p.rank,
                p.name,
                pod_uid(self.job, p.generation, p.rank),
                *bubbles.get((namespace, self.job.name, p.rank), ((), None)),
            )
            for p in sorted(pods, key=lambda p: p.rank)
            if running and p.trainer_running
        )
        listed = {r.pod_uid for r in ranks}
        others = frozenset(uid for p in pods if (uid := pod_uid(self.job, p.generation, p.rank)) not in listed)
        training = TrainingJobView.from_spec(
            self.job, ranks=ranks, namespace=namespace, running=running, schedule_csv=self.schedule_csv
        )
        views = tuple(self._views[f.name][1] for f in self.fills)
        result = schedule_pass(
            Snapshot(views, (training,), others), policy=self.policy, max_jobs_per_rank=self.max_jobs_per_rank
        )
        hosts = {training.key} if running else set()
        now = now_rfc3339()
        wrote = False
        for fill in self.fills:
            body = {**self._bodies[fill.name], "status": statuses[fill.name]}
            patch = decide(body, result.jobs.get((_namespace(fill), fill.name)), running_hosts=hosts, now=now).patch
            if patch is not None:
                wrote = self._write(fill.name, statuses[fill.name], patch) or wrote
        self.last, self._passed_at = result, time.monotonic()
        self._inputs = None if wrote else inputs  # its own writes are inputs of the next pass
        return result

    def _write(self, name: str, seen: dict[str, Any], patch: dict[str, Any]) -> bool:
        """Apply ``patch`` to the status file if it is still ``seen``; whether it was."""
        with _locked(self.work_dir / f"{name}.locks" / "status.lock"):
            if self._read(name) != seen:
                return False  # an executor reported since: the next pass starts from its status
            status = {k: v for k, v in {**seen, **patch}.items() if v is not None}
            tmp = self._path(name).with_suffix(".json.tmp")
            tmp.write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, self._path(name))
        return True
