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
with each conflict. It writes only its own fields (:func:`~pipefill.queue.status.executor_patch`); the plan's bounds,
assignments, epoch and conditions are the operator's.

Requests: one list and one long watch per ``watch_timeout_s`` while idle; a GET and a PATCH per status report.
"""

from __future__ import annotations

import logging
import os
import random
import time
from pathlib import Path
from typing import Any, cast

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from pipefill import env
from pipefill.queue.status import executor_patch
from pipefill.spec import GROUP, VERSION, FillJob, SpecError, parse
from pipefill_fill.sources.base import (
    FINAL_PHASES,
    FollowsAssignments,
    Identity,
    ProgressReport,
    WorkSource,
    assigned_here,
    assignment_gone,
)
from pipefill_fill.sources.reporter import Reporter, Transient
from pipefill_fill.sources.watch import PLURAL, WATCH_TIMEOUT_S, FillJobCache
from pipefill_fill.work import Slice, TaskSpec

__all__ = ["KubernetesSource"]

log = logging.getLogger("pipefill_fill")

_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
REQUEST_TIMEOUT_S = (2.0, 5.0)
"""(connect, read) seconds a status request waits; the reporter tries again later (sources/reporter.py)"""
_CONFLICT_RETRIES = 8
_CONFLICT_BACKOFF_S = 0.005
"""the first wait after a conflict; doubled at each one, drawn at random up to it (writers that raced do not race
again in step)"""


class KubernetesSource(FollowsAssignments, WorkSource):
    def __init__(
        self,
        *,
        identity: Identity,
        namespace: str | None = None,
        api: client.CustomObjectsApi | None = None,
        label_selector: str | None = None,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
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
        FollowsAssignments.__init__(self)
        self.reporter = Reporter(self._send)

    def poll(self) -> list[TaskSpec]:
        specs: list[TaskSpec] = []
        assigned: dict[str, dict[Slice, int]] = {}
        for obj in self.cache.objects():
            status, spec = obj.get("status") or {}, obj.get("spec") or {}
            if status.get("phase") in FINAL_PHASES or spec.get("cancel") or spec.get("suspend"):
                continue  # not parsed: most FillJobs of a large queue are not this executor's
            if not assigned_here(status, self.identity) or (job := self._parse(obj)) is None:
                continue
            mine = self.offer(job, status, self.identity, into=specs, storage_dir=self.storage_dir)
            if mine:
                assigned[job.name] = mine
        self._assigned = assigned
        return sorted(specs, key=lambda s: (-s.priority, s.name))

    def changed(self) -> bool:
        return self.cache.changed()

    def revoked(self, name: str, slice: Slice, epoch: int) -> str | None:
        return assignment_gone(self.cache.get(name), self.identity, slice, epoch)

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
                changed = executor_patch(obj.get("status") or {}, reports, identity=self.identity)
                if changed is None:
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
