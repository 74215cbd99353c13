"""What a job needs before its pods can be created, and is not the operator's to create: the ConfigMap of a custom
schedule, a GPU resource some node offers, the DRA DeviceClass, the PodGroup API of the chosen gang mechanism, the
ConfigMaps and claims the pods mount (the model's, the data's, the fill storage: :mod:`pipefill.lifecycle.volumes`),
the checkpoint claim. A missing one is a Waiting condition that clears by itself: the watch of each awaited object
and the node watch wake the job, and a Waiting job is looked at again every minute.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipefill.children import schedule_csv_of
from pipefill.lifecycle.volumes import MountedObject, missing_mounts, mounted_objects
from pipefill.podgroups import POD_GROUP_APIS
from pipefill.spec import GangMode, PipelineTrainingJob, SharingMode
from pipefill_operator.kube import ApiError, Kube, resource_of

__all__ = ["NodeIndex", "Prerequisites"]

_FEATURE_HINTS = {
    GangMode.KUBERNETES: "Kubernetes' gang scheduling needs the GenericWorkload and GangScheduling feature gates and "
    "--runtime-config=scheduling.k8s.io/v1alpha2=true (Kubernetes >= 1.36)",
    GangMode.VOLCANO: "install Volcano",
    GangMode.COSCHEDULING: "install scheduler-plugins with the coscheduling plugin",
}


class NodeIndex:
    """Which extended resources (``nvidia.com/gpu``) some node offers, kept from the node watch."""

    def __init__(self) -> None:
        self._offered: dict[str, set[str]] = {}  # resource -> nodes with allocatable > 0
        self.seeded = False

    def update(self, node: dict[str, Any], *, deleted: bool = False) -> set[str]:
        """Record ``node``; returns the resources that no node offered before and this one does now."""
        name = str((node.get("metadata") or {}).get("name", ""))
        allocatable = ((node.get("status") or {}).get("allocatable")) or {}
        offered = set() if deleted else {r for r, v in allocatable.items() if "/" in r and str(v) not in ("0", "")}
        new = set()
        for resource, nodes in self._offered.items():
            if resource not in offered:
                nodes.discard(name)
        for resource in offered:
            nodes = self._offered.setdefault(resource, set())
            if not nodes:
                new.add(resource)
            nodes.add(name)
        return new

    def offers(self, resource: str) -> bool:
        return bool(self._offered.get(resource))


class Prerequisites:
    """Looks up what a job needs; remembers APIs once they are found (they do not disappear while it runs)."""

    def __init__(self, kube: Kube, nodes: NodeIndex | None) -> None:
        self.kube, self.nodes = kube, nodes
        self._served: set[str] = set()
        # the resourceVersion of each ConfigMap and claim as last read here (None: it did not exist); the watch of
        # an awaited object wakes its jobs when the object is no longer what they saw
        self.seen: dict[tuple[str, str, str], str | None] = {}

    async def _get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        obj = await self.kube.get(resource_of("v1", kind), name, namespace)
        self.seen[(kind, namespace, name)] = None if obj is None else str(obj["metadata"].get("resourceVersion"))
        return obj

    async def schedule_csv(self, job: PipelineTrainingJob, namespace: str) -> tuple[str | None, tuple[str, str] | None]:
        """(CSV of schedule custom, waiting reason and message if its ConfigMap or key is missing)."""
        ref = job.spec.pipeline.custom_schedule
        if ref is None:
            return None, None
        config_map = await self._get("ConfigMap", ref.name, namespace)
        try:
            return schedule_csv_of(job, config_map), None
        except LookupError as exc:
            return None, ("ConfigMapMissing", f"{exc}; the job starts once it exists")

    async def _served_api(self, api_version: str, namespace: str) -> bool:
        if api_version in self._served:
            return True
        try:
            await self.kube.request("GET", resource_of(api_version, "PodGroup").path(namespace), params={"limit": "1"})
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        self._served.add(api_version)
        return True

    async def waiting(self, job: PipelineTrainingJob, namespace: str) -> tuple[str, str] | None:
        """Why the job cannot create its pods yet, or None."""
        spec = job.spec
        if spec.resources.gpus > 0 and spec.gpu_sharing.mode == SharingMode.DRA:
            name = spec.gpu_sharing.device_class_name
            if await self.kube.get(resource_of("resource.k8s.io/v1", "DeviceClass"), name) is None:
                return (
                    "DeviceClassMissing",
                    f"DeviceClass {name!r} (spec.gpuSharing.deviceClassName) does not exist: install the DRA driver "
                    "or use gpuSharing.mode visibleDevices",
                )
        elif (
            spec.resources.gpus > 0
            and self.nodes is not None
            and not self.nodes.offers(spec.resources.gpu_resource_name)
        ):
            return (
                "ResourceUnavailable",
                f"no node offers {spec.resources.gpu_resource_name} (spec.resources.gpuResourceName); the job starts "
                "once a node does",
            )
        gang = spec.scheduling.gang
        if gang != GangMode.NONE and not await self._served_api(POD_GROUP_APIS[gang], namespace):
            return (
                "PodGroupApiMissing",
                f"the API server does not serve {POD_GROUP_APIS[gang]} PodGroups (spec.scheduling.gang {gang.value}): "
                f"{_FEATURE_HINTS[gang]}",
            )
        return None

    async def mounts(
        self, job: PipelineTrainingJob, namespace: str
    ) -> tuple[list[MountedObject], tuple[str, str]] | None:
        """The ConfigMaps and claims the pods would mount that are missing (or lack a key), and the Waiting
        (reason, message) naming them; None when all are there. One GET each, and only before the pods exist."""
        needed = mounted_objects(job)
        if not needed:
            return None
        found = await asyncio.gather(*(self._get(m.kind, m.name, namespace) for m in needed))
        return missing_mounts(needed, found)

    async def checkpoint_claim(self, job: PipelineTrainingJob, namespace: str) -> dict[str, Any] | None:
        name = job.spec.checkpoint.claim_name
        if name is None:
            return None
        return await self._get("PersistentVolumeClaim", name, namespace)
