"""``kubernetes``: the FillJob objects the operator assigned to this pod (the only module that imports the client).

Slices are the operator's to hand out. A FillJob is assigned to this executor when its ``status.assignments`` lists
this pod's PipelineTrainingJob and rank (``PIPEFILL_JOB_NAME``, ``PIPEFILL_RANK``); each such assignment's
``[start, end)`` is a slice this executor may run, and :meth:`KubernetesSource.claim` returns it when it is one of the
job's unfinished slices. The slice bounds are the job's plan, fixed in ``slices.json`` of its output directory
(:func:`pipefill_fill.slices.plan_slices` of totalSamples and maxParallelRanks; the operator must assign those very
ranges, from the same function), and a job split across pods needs that directory on storage they share. The operator
keeps at most ``maxParallelRanks`` assignments of a job, moves a slice whose pod died to another (its new executor
recovers the slice's store) and assigns the next slice when one is done; a faster rank thus gets more slices. Which
slices are done it learns from the executors' status (per-assignment progress is the operator issue's to add), not
implemented here, like watching instead of polling, conditions and events.

The executor reports by a merge patch of the status subresource (phase, samplesDone, progress, throughput,
estimatedCompletionTime, startTime, completionTime; assignments and conditions stay the operator's). Several pods
report one job, so each patch is merged with the status just read (:func:`merged_status`: final phases stay,
samplesDone never decreases) and carries its ``metadata.resourceVersion``: a patch that raced another one is refused
with 409 Conflict and merged again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from pipefill import env
from pipefill.spec import GROUP, VERSION, FillJob, SpecError, parse
from pipefill_fill.sources.base import FINAL_PHASES, Identity, ProgressReport, WorkSource, merged_status
from pipefill_fill.work import Slice, TaskSpec

__all__ = ["KubernetesSource"]

log = logging.getLogger("pipefill_fill")

PLURAL = "filljobs"
_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_CONFLICT_RETRIES = 5
_OWNED_FIELDS = (
    "phase",
    "samplesDone",
    "progress",
    "throughput",
    "estimatedCompletionTime",
    "startTime",
    "completionTime",
)


class KubernetesSource(WorkSource):
    def __init__(
        self,
        *,
        identity: Identity,
        namespace: str | None = None,
        api: client.CustomObjectsApi | None = None,
        label_selector: str | None = None,
    ) -> None:
        self.identity = identity
        self.label_selector = label_selector
        if api is None:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config()  # type: ignore[no-untyped-call]  # outside a cluster: the user's kubeconfig
            api = client.CustomObjectsApi()
        self.api = api
        self.namespace = namespace or _own_namespace()
        self._assigned: dict[str, list[Slice]] = {}  # job -> slices assigned to this pod, as of the last poll
        self._last: list[TaskSpec] = []

    def poll(self) -> list[TaskSpec]:
        try:
            listing = cast(
                dict[str, Any],
                self.api.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, label_selector=self.label_selector or ""
                ),
            )
        except ApiException as exc:
            log.warning(
                "work source: listing FillJobs in %s failed (%s %s); keeping the last list, retrying later",
                self.namespace,
                exc.status,
                exc.reason,
            )
            return list(self._last)
        specs, assigned = [], {}
        for obj in listing.get("items", []):
            status = obj.get("status") or {}
            mine = self._assigned_here(status)
            if status.get("phase") in FINAL_PHASES or not mine:
                continue
            job = self._parse(obj)
            if job is not None:
                specs.append(TaskSpec.from_spec(job))
                assigned[job.name] = mine
        self._assigned, self._last = assigned, sorted(specs, key=lambda s: (-s.priority, s.name))
        return list(self._last)

    def claim(self, spec: TaskSpec, slices: Sequence[Slice]) -> Slice | None:
        mine = self._assigned.get(spec.name, [])
        found = next((s for s in slices if s in mine), None)
        if found is None and mine:
            log.info(
                "work source: FillJob %s: the slices assigned here (%s) are none of its unfinished ones (%s)",
                spec.name,
                ", ".join(map(str, mine)),
                ", ".join(map(str, slices)),
            )
        return found

    def release(self, name: str, slice: Slice | None = None) -> None:
        return None  # the operator moves assignments

    def report(self, name: str, report: ProgressReport) -> None:
        try:
            for _ in range(_CONFLICT_RETRIES):
                obj = cast(
                    dict[str, Any],
                    self.api.get_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, name),
                )
                merged = merged_status(obj.get("status") or {}, report, identity=self.identity, held=None)
                if merged is None:
                    return
                patch = {
                    "metadata": {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion")},
                    "status": {k: merged[k] for k in _OWNED_FIELDS if k in merged},
                }
                try:
                    self.api.patch_namespaced_custom_object_status(
                        GROUP,
                        VERSION,
                        self.namespace,
                        PLURAL,
                        name,
                        patch,
                        _content_type="application/merge-patch+json",
                    )
                    return
                except ApiException as exc:
                    if exc.status != 409:
                        raise
            log.warning("work source: status of FillJob %s not updated: %d conflicts in a row", name, _CONFLICT_RETRIES)
        except ApiException as exc:
            # Progress is durable in the output directory; a lost status update is repaired by the next one.
            log.warning("work source: status of FillJob %s not updated (%s %s)", name, exc.status, exc.reason)

    def _assigned_here(self, status: dict[str, Any]) -> list[Slice]:
        out = []
        for a in status.get("assignments") or []:
            if a.get("trainingJob") == self.identity.training_job and a.get("rank") == self.identity.rank:
                try:
                    out.append(Slice(int(a.get("start", 0)), int(a.get("end", 0))))
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
