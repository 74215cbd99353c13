"""``kubernetes``: the FillJob objects the operator assigned to this pod (the only module that imports the client).

A FillJob is assigned to this executor when its ``status.assignments`` lists this pod's PipelineTrainingJob and rank
(``PIPEFILL_JOB_NAME``, ``PIPEFILL_RANK``); the operator writes assignments. The executor reports its progress by a
merge patch of the status subresource (phase, samplesDone, progress, throughput, estimatedCompletionTime, startTime,
completionTime); assignments and conditions stay the operator's. Ownership needs no lock here: the operator assigns
each job to one rank. What the operator side adds (watching instead of polling, slices for maxParallelRanks > 1,
conditions and events) belongs to the operator issue.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from pipefill.spec import GROUP, VERSION, FillJob, FillJobPhase, SpecError, parse, to_obj
from pipefill_fill.sources.base import Identity, ProgressReport, WorkSource, status_from_report
from pipefill_fill.task import TaskSpec

__all__ = ["KubernetesSource"]

log = logging.getLogger("pipefill_fill")

PLURAL = "filljobs"
_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_FINAL = {FillJobPhase.SUCCEEDED.value, FillJobPhase.FAILED.value, FillJobPhase.CANCELLED.value}
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
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()  # outside a cluster: the user's kubeconfig
            api = client.CustomObjectsApi()
        self.api = api
        self.namespace = namespace or _own_namespace()

    def poll(self) -> list[TaskSpec]:
        try:
            listing = self.api.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, label_selector=self.label_selector or ""
            )
        except ApiException as exc:
            log.warning(
                "work source: listing FillJobs in %s failed (%s %s); retrying later",
                self.namespace,
                exc.status,
                exc.reason,
            )
            return []
        specs = []
        for obj in listing.get("items", []):
            status = obj.get("status") or {}
            if status.get("phase") in _FINAL or not self._assigned_here(status):
                continue
            job = self._parse(obj)
            if job is not None:
                specs.append(TaskSpec.from_spec(job))
        return sorted(specs, key=lambda s: (-s.priority, s.name))

    def acquire(self, name: str) -> bool:
        return True  # the operator assigns each job to one rank

    def release(self, name: str) -> None:
        return None

    def report(self, name: str, report: ProgressReport) -> None:
        full = to_obj(status_from_report(report, self.identity))
        patch = {"status": {k: full[k] for k in _OWNED_FIELDS if k in full}}
        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, PLURAL, name, patch, _content_type="application/merge-patch+json"
            )
        except ApiException as exc:
            # Progress is durable in the output directory; a lost status update is repaired by the next one.
            log.warning("work source: status of FillJob %s not updated (%s %s)", name, exc.status, exc.reason)

    def _assigned_here(self, status: dict[str, Any]) -> bool:
        return any(
            a.get("trainingJob") == self.identity.training_job and a.get("rank") == self.identity.rank
            for a in status.get("assignments") or []
        )

    def _parse(self, obj: dict[str, Any]) -> FillJob | None:
        name = (obj.get("metadata") or {}).get("name", "?")
        try:
            job = parse(obj, source=f"FillJob {self.namespace}/{name}")
        except SpecError as exc:
            log.error("work source: %s", exc)
            return None
        return job if isinstance(job, FillJob) else None


def _own_namespace() -> str:
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return _NAMESPACE_FILE.read_text().strip()
    except OSError:
        return "default"
