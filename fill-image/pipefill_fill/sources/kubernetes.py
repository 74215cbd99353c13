"""``kubernetes``: the FillJob objects the operator assigned to this pod (the only module, with watch.py, that imports
the client).

Slices are the operator's to hand out, from the plan of record it writes once into ``status.slices``
(:func:`pipefill.queue.plan_slices`); a job without one is not scheduled yet and not offered. A slice ``[start, end)``
is assigned to this executor while ``status.assignments`` has an entry for it with this pod's uid
(``PIPEFILL_POD_UID``, from the downward API; outside a pod, this training job and rank) and an ``epoch``. The
executor opens the slice's store with that epoch, and at every commit the store asks :meth:`KubernetesSource.revoked`
whether that very assignment (uid, bounds, epoch) is still in the status and the job not cancelled; the answer comes
from the watch cache (:mod:`pipefill_fill.sources.watch`), and the store's own epoch fence covers the moments the
cache is behind (docs/fill.md, "Guarantees"). A job that is cancelled, suspended (the operator removed the
assignments), final or deleted is no longer offered: the executor stops it at the next bubble without committing.

The executor reports off its filling thread (:mod:`pipefill_fill.sources.reporter`: queued, sent by one thread with a
request timeout, tried again while the API server does not answer, the reports of one job that piled up sent as
one), by a merge patch of the status subresource, merged with the status just read
(:func:`merged_status`: final phases stay, commit pointers and samplesDone never go backwards, this rank's unfit and
bubble-class entries replaced) and carrying its ``metadata.resourceVersion``: a patch that raced another writer (an
executor, the operator) is refused with 409 Conflict, read again and merged again, after a random wait that doubles
with each conflict. It writes only its own fields (:data:`OWNED_FIELDS`); the plan's bounds, assignments, epoch and
conditions are the operator's.

Requests: one list and one long watch per ``watch_timeout_s`` while idle; a GET and a PATCH per status report.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from pipefill import env
from pipefill.queue.status import plan_of_record
from pipefill.spec import GROUP, VERSION, FillJob, SpecError, parse
from pipefill_fill.sources.base import FINAL_PHASES, Identity, ProgressReport, WorkSource, merged_status
from pipefill_fill.sources.reporter import Reporter, Transient
from pipefill_fill.sources.watch import PLURAL, FillJobCache
from pipefill_fill.work import Slice, TaskSpec

__all__ = ["OWNED_FIELDS", "KubernetesSource"]

log = logging.getLogger("pipefill_fill")

_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
REQUEST_TIMEOUT_S = (2.0, 5.0)
"""(connect, read) seconds a status request waits; the reporter tries again later (sources/reporter.py)"""
_CONFLICT_RETRIES = 8
_CONFLICT_BACKOFF_S = 0.005
"""the first wait after a conflict; doubled at each one, drawn at random up to it (writers that raced do not race
again in step)"""
OWNED_FIELDS = (
    "phase",
    "message",
    "slices",
    "unfit",
    "profile",
    "bubbleClasses",
    "samplesDone",
    "progress",
    "throughput",
    "estimatedCompletionTime",
    "startTime",
    "completionTime",
)
"""The status fields the executor writes (all others are the operator's); ``phase`` only to a final phase it
decides (Succeeded: outputs assembled; Failed: the workload raised)."""
_EXECUTOR_PHASES = frozenset({"Succeeded", "Failed"})


class KubernetesSource(WorkSource):
    def __init__(
        self,
        *,
        identity: Identity,
        namespace: str | None = None,
        api: client.CustomObjectsApi | None = None,
        label_selector: str | None = None,
        watch_timeout_s: int = 300,
        request_timeout_s: tuple[float, float] = REQUEST_TIMEOUT_S,
    ) -> None:
        self.identity = identity
        self.request_timeout_s = request_timeout_s
        if api is None:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config()  # type: ignore[no-untyped-call]  # outside a cluster: the user's kubeconfig
            api = client.CustomObjectsApi()
        self.api = api
        self.namespace = namespace or _own_namespace()
        storage = os.environ.get(env.FILL_STORAGE_DIR)
        self.storage_dir = Path(storage) if storage else None  # where the training job's fill storage is mounted
        if identity.pod_uid is None:
            log.warning("work source: %s is not set; matching assignments by training job and rank", env.POD_UID)
        self.cache = FillJobCache(
            api, self.namespace, label_selector=label_selector or "", watch_timeout_s=watch_timeout_s
        )
        self._assigned: dict[str, dict[Slice, int]] = {}  # job -> slice -> epoch assigned to this pod, as last polled
        self._held: dict[tuple[str, Slice], int] = {}  # slices claimed, with the epoch they were claimed at
        self._said: dict[str, tuple[tuple[Slice, ...], tuple[Slice, ...]]] = {}  # job -> the mismatch last logged
        self.reporter = Reporter(self._send)

    def poll(self) -> list[TaskSpec]:
        specs, assigned = [], {}
        for obj in self.cache.objects():
            status, spec = obj.get("status") or {}, obj.get("spec") or {}
            mine = self._assigned_here(status)
            if status.get("phase") in FINAL_PHASES or spec.get("cancel") or spec.get("suspend") or not mine:
                continue
            job = self._parse(obj)
            plan = plan_of_record(status)
            if job is None or not plan:  # no plan yet: the operator has not scheduled the job
                continue
            try:
                specs.append(TaskSpec.from_spec(job, plan=plan, storage_dir=self.storage_dir))
            except ValueError as exc:
                log.error("work source: %s", exc)
                continue
            assigned[job.name] = mine
        self._assigned = assigned
        return sorted(specs, key=lambda s: (-s.priority, s.name))

    def changed(self) -> bool:
        return self.cache.changed()

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

    def revoked(self, name: str, slice: Slice, epoch: int) -> str | None:
        obj = self.cache.get(name)
        if obj is None:
            return "the FillJob was deleted"
        status, spec = obj.get("status") or {}, obj.get("spec") or {}
        if spec.get("cancel"):
            return "the FillJob was cancelled (spec.cancel)"
        if status.get("phase") in FINAL_PHASES:
            return f"the FillJob is {status['phase']}"
        if self._assigned_here(status).get(slice) == epoch:
            return None
        now = [a for a in status.get("assignments") or [] if (a.get("start"), a.get("end")) == (slice.start, slice.end)]
        where = ", ".join(f"epoch {a.get('epoch')} on pod {a.get('pod') or a.get('podUID')}" for a in now)
        return f"its assignment at epoch {epoch} is gone ({'now ' + where if where else 'unassigned'})"

    def release(self, name: str, slice: Slice | None = None) -> None:
        for key in [k for k in self._held if k[0] == name and (slice is None or k[1] == slice)]:
            del self._held[key]  # the operator moves assignments; this only forgets the claim

    def report(self, name: str, report: ProgressReport) -> None:
        """Queued for the reporter thread: the API server's answer is never waited for here (the filling thread)."""
        self.reporter.submit(name, report)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until the reports made so far reached the API server (or were refused for good); whether in time."""
        return self.reporter.flush(timeout_s)

    def _send(self, name: str, reports: list[ProgressReport]) -> None:
        """The reporter's send: read the status, merge ``reports`` into it in order, patch what changed of ours."""
        try:
            for attempt in range(_CONFLICT_RETRIES):
                if attempt:
                    time.sleep(random.uniform(0, _CONFLICT_BACKOFF_S * 2 ** (attempt - 1)))
                obj = cast(
                    dict[str, Any],
                    self.api.get_namespaced_custom_object_status(
                        GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=self.request_timeout_s
                    ),
                )
                old = merged = obj.get("status") or {}
                for report in reports:
                    merged = merged_status(merged, report, identity=self.identity, held=None) or merged
                changed = {k: merged.get(k) for k in OWNED_FIELDS if merged.get(k) != old.get(k)}
                if merged.get("phase") not in _EXECUTOR_PHASES:
                    changed.pop("phase", None)  # Queued and Running are the operator's (assignments decide them)
                if not changed:
                    return
                patch = {"metadata": {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion")}}
                patch["status"] = changed  # None removes a field (merge patch)
                try:
                    self.api.patch_namespaced_custom_object_status(
                        GROUP,
                        VERSION,
                        self.namespace,
                        PLURAL,
                        name,
                        patch,
                        _content_type="application/merge-patch+json",
                        _request_timeout=self.request_timeout_s,
                    )
                    return
                except ApiException as exc:
                    if exc.status != 409:
                        raise
            raise Transient(f"{_CONFLICT_RETRIES} conflicts in a row")
        except ApiException as exc:
            if exc.status in (0, 429) or exc.status >= 500:
                raise Transient(f"{exc.status} {exc.reason}") from None
            # 403, 404 (the job is gone), 422: permanent; progress is durable in the job's storage
            log.warning("work source: status of FillJob %s not updated (%s %s)", name, exc.status, exc.reason)
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # timed out, refused, reset: the server may come back
            raise Transient(f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self.reporter.close(timeout_s=sum(self.request_timeout_s) + 5.0)
        self.cache.close()

    def _assigned_here(self, status: dict[str, Any]) -> dict[Slice, int]:
        me = self.identity
        out = {}
        for a in status.get("assignments") or []:
            if me.pod_uid is not None:
                if a.get("podUID") != me.pod_uid:
                    continue
            elif (a.get("trainingJob"), a.get("rank")) != (me.training_job, me.rank):
                continue
            try:
                out[Slice(int(a.get("start", 0)), int(a.get("end", 0)))] = int(a.get("epoch") or 0)
            except ValueError as exc:
                log.error("work source: assignment %s: %s", a, exc)
        return out

    def _parse(self, obj: dict[str, Any]) -> FillJob | None:
        name = (obj.get("metadata") or {}).get("name", "?")
        try:
            job = parse(obj, source=f"FillJob {self.namespace}/{name}")
        except SpecError as exc:
            log.error("work source: %s", exc)
            return None
        return job if isinstance(job, FillJob) else None


def _own_namespace() -> str:
    if os.environ.get(env.POD_NAMESPACE):
        return os.environ[env.POD_NAMESPACE]
    try:
        return _NAMESPACE_FILE.read_text().strip()
    except OSError:
        return "default"
