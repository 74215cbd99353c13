"""What the operator keeps of the cluster between events: projections of rank pods, training jobs and FillJobs.

One cache, fed by kopf's watches and read by the reconciles and the fill queue's pass (client-go's shared informer
is the model). It holds *projections*, never whole bodies: of a pod the fields the lifecycle, the status reader and
the fill queue read (a few hundred bytes instead of the ~10 kB a rank pod's body takes, managedFields included); of
a job its spec and status without managedFields or the last-applied annotation. Nothing is deep-copied: a
projection is built once per event from kopf's fresh body and replaced, never changed, afterwards.

Everything here runs on the event loop (the kopf handlers are ``async def``): no locks, and no iteration races with
a handler. Safety of the lifecycle and of reassignment rests on one fact this cache must get right: an object is
gone only when the API server says so (a DELETED event, or a list that no longer has it). So events and lists are
merged by resourceVersion (an older copy never replaces a newer one), a deleted uid never comes back (uids are not
reused), and each kind is listed in full once at start (:meth:`ClusterCache.seed`) and again only when its watch had
to start over (kopf lists again after a 410 Gone and replays the objects as events of type None; a deletion that
fell into the gap shows up only in a list), never every period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from pipefill.children import JOB_LABEL
from pipefill.lifecycle.images import is_stuck
from pipefill.pods import GENERATION_LABEL, RANK_LABEL, SPEC_GENERATION_LABEL
from pipefill_operator.kube import ApiError, Kube, Resource, resource_of

__all__ = [
    "ClusterCache",
    "ObjectIndex",
    "PodIndex",
    "project_object",
    "project_pod",
    "rv_of",
]

log = logging.getLogger("pipefill_operator")

_TOMBSTONES = 65536  # deleted uids remembered, so that a late list or event cannot resurrect them
_LIST_PAGE = 500  # items per list request: a list of 8 000 pods never sits in memory at once
_LABELS = (JOB_LABEL, RANK_LABEL, GENERATION_LABEL, SPEC_GENERATION_LABEL)
_CONTAINERS = ("trainer", "fill-executor")
_PORT_NAMES = ("trainer-metrics", "fill-metrics")
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# A watch restart replays its objects as type-None events; kopf's own first list does so too, once, at start. Within
# this long after the cache's own list of a kind, and before that kind's watch has streamed a real event, type-None
# events are taken for that first list and start no list of ours.
_START_GRACE_S = 60.0

POD = resource_of("v1", "Pod")
PTJ = resource_of("pipefill.io/v1alpha1", "PipelineTrainingJob")
FILLJOB = resource_of("pipefill.io/v1alpha1", "FillJob")


def rv_of(obj: dict[str, Any]) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def _pick(source: dict[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    return {k: source[k] for k in keys if k in source}


def _ports(containers: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for container in containers:
        ports = [p for p in container.get("ports") or () if p.get("name") in _PORT_NAMES]
        if ports:
            out.append({"name": container.get("name"), "ports": ports})
    return out


def _container_status(status: dict[str, Any]) -> dict[str, Any]:
    """A container's status as the lifecycle reads it; the image only of one that cannot start (images.py)."""
    keys = ("name", "state", "restartCount")
    return _pick(status, (*keys, "image") if is_stuck(status) else keys)


def project_pod(body: Any) -> dict[str, Any]:
    """The fields of a rank pod that anything in the operator reads: identity, our labels, the owner's uid, the
    deletion mark; phase, reason, message, IP, the DisruptionTarget condition, the trainer's and fill executor's
    container states and those of any container that cannot start (with its image); the metrics ports."""
    meta, status, spec = body.get("metadata") or {}, body.get("status") or {}, body.get("spec") or {}
    projected_meta = _pick(meta, ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp"))
    projected_meta["labels"] = _pick(meta.get("labels") or {}, _LABELS)
    projected_meta["ownerReferences"] = [{"uid": r.get("uid")} for r in meta.get("ownerReferences") or ()]
    projected_status = _pick(status, ("phase", "reason", "message", "podIP"))
    conditions = [c for c in status.get("conditions") or () if c.get("type") == "DisruptionTarget"]
    if conditions:
        projected_status["conditions"] = conditions
    for field in ("containerStatuses", "initContainerStatuses"):
        kept = [_container_status(s) for s in status.get(field) or () if s.get("name") in _CONTAINERS or is_stuck(s)]
        if kept:
            projected_status[field] = kept
    projected_spec = {"containers": _ports(spec.get("containers") or ())}
    init = _ports(spec.get("initContainers") or ())
    if init:
        projected_spec["initContainers"] = init
    return {"metadata": projected_meta, "spec": projected_spec, "status": projected_status}


def project_object(body: Any) -> dict[str, Any]:
    """A PipelineTrainingJob or FillJob as its handlers and the fill queue read it: everything but managedFields and
    the last-applied annotation (a copy of the spec the size of the spec). Shallow: spec and status are shared with
    kopf's body, which kopf builds anew for every event and never changes afterwards."""
    out = dict(body)
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if annotations and _LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != _LAST_APPLIED}
    out["metadata"] = meta
    return out


class ObjectIndex:
    """Objects of one kind by uid, merged from watch events and lists by resourceVersion."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self._deleted: OrderedDict[str, int] = OrderedDict()

    def event(self, obj: dict[str, Any], *, deleted: bool) -> bool:
        """Apply a watch event (or the API server's answer to a write); True when the index changed."""
        uid = str(obj["metadata"].get("uid") or "")
        if not uid or uid in self._deleted:
            return False
        if deleted:
            self._tombstone(uid, rv_of(obj))
            return self._drop(uid)
        known = self.objects.get(uid)
        if known is not None and rv_of(known) >= rv_of(obj):
            return False
        self._put(uid, obj)
        return True

    def relist(self, items: Iterable[dict[str, Any]], list_rv: int, *, namespace: str | None = None) -> bool:
        """Merge a full list (of ``namespace``; None: all) taken at ``list_rv``: what it lacks, and the index did not
        see change after it, is gone. True when the index changed."""
        seen: set[str] = set()
        changed = False
        for obj in items:
            seen.add(str(obj["metadata"].get("uid") or ""))
            changed |= self.event(obj, deleted=False)
        for uid, obj in list(self.objects.items()):
            if namespace is not None and obj["metadata"].get("namespace") != namespace:
                continue
            if uid not in seen and rv_of(obj) <= list_rv:
                self._drop(uid)
                self._tombstone(uid, list_rv)
                changed = True
        return changed

    def _put(self, uid: str, obj: dict[str, Any]) -> None:
        self.objects[uid] = obj

    def _drop(self, uid: str) -> bool:
        return self.objects.pop(uid, None) is not None

    def _tombstone(self, uid: str, rv: int) -> None:
        self._deleted[uid] = rv
        while len(self._deleted) > _TOMBSTONES:
            self._deleted.popitem(last=False)


class PodIndex(ObjectIndex):
    """Rank pod projections by uid, and the uids of each job's pods (by namespace and the job-name label)."""

    def __init__(self) -> None:
        super().__init__()
        self._by_job: dict[tuple[str, str], set[str]] = {}

    @staticmethod
    def _job_of(obj: dict[str, Any]) -> tuple[str, str]:
        meta = obj["metadata"]
        return str(meta.get("namespace") or ""), str((meta.get("labels") or {}).get(JOB_LABEL) or "")

    def _put(self, uid: str, obj: dict[str, Any]) -> None:
        self._drop(uid)
        super()._put(uid, obj)
        self._by_job.setdefault(self._job_of(obj), set()).add(uid)

    def _drop(self, uid: str) -> bool:
        obj = self.objects.pop(uid, None)
        if obj is None:
            return False
        key = self._job_of(obj)
        uids = self._by_job.get(key)
        if uids is not None:
            uids.discard(uid)
            if not uids:
                del self._by_job[key]
        return True

    def pods_of(self, key: tuple[str, str]) -> list[dict[str, Any]]:
        """The pods labelled with job ``key`` (namespace, name), by name."""
        pods = [self.objects[uid] for uid in self._by_job.get(key, ())]
        return sorted(pods, key=lambda p: str(p["metadata"].get("name")))


class ClusterCache:
    """The three indexes, their lists at start and after a watch restart, and who to tell when they change."""

    def __init__(self, kube: Kube, *, namespaces: tuple[str, ...] = (), fill_jobs: bool = True) -> None:
        self.kube, self.namespaces = kube, namespaces
        self.pods = PodIndex()
        self.training_jobs = ObjectIndex()
        self.fill_jobs = ObjectIndex()
        self._kinds: dict[str, tuple[Resource, ObjectIndex, Callable[[Any], dict[str, Any]], str | None]] = {
            "pods": (POD, self.pods, project_pod, JOB_LABEL),
            "training_jobs": (PTJ, self.training_jobs, project_object, None),
        }
        if fill_jobs:
            self._kinds["fill_jobs"] = (FILLJOB, self.fill_jobs, project_object, None)
        self.seeded = False
        self.on_change: list[Callable[[str], None]] = []  # told the kind after a list changed an index
        self._listed_at: dict[str, float] = {}
        self._streaming: set[str] = set()  # kinds whose watch has streamed a real event since our list
        self._resyncs: dict[str, asyncio.Task[None]] = {}

    async def seed(self) -> None:
        """List every kind once; until this is done an absent object means "not seen yet", never "gone"."""
        for kind in self._kinds:
            await self._list(kind)
        self.seeded = True

    async def close(self) -> None:
        for task in self._resyncs.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._resyncs.clear()

    def event(self, kind: str, type_: str | None, body: Any) -> tuple[dict[str, Any], bool]:
        """A watch event of ``kind``: (the projection, whether the index changed). A type-None event that is no
        part of kopf's first list means the watch started over: the kind is listed again, once, shortly."""
        _res, index, project, _selector = self._kinds[kind]
        obj = project(body)
        if type_ is None:
            if self.seeded and self._restarted(kind):
                self._resync(kind)
        else:
            self._streaming.add(kind)
        return obj, index.event(obj, deleted=type_ == "DELETED")

    def _restarted(self, kind: str) -> bool:
        if kind in self._streaming:
            return True
        return time.monotonic() - self._listed_at.get(kind, 0.0) > _START_GRACE_S

    def _resync(self, kind: str) -> None:
        task = self._resyncs.get(kind)
        if task is not None and not task.done():
            return  # one list covers every replayed object of this restart
        self._streaming.discard(kind)
        self._resyncs[kind] = asyncio.create_task(self._relist_later(kind), name=f"relist-{kind}")

    async def _relist_later(self, kind: str) -> None:
        await asyncio.sleep(1.0)  # let kopf's replay run on: one list after the burst
        delay_s = 1.0
        while True:
            try:
                await self._list(kind)
                return
            except (ApiError, TimeoutError) as exc:
                log.warning("listing %s after a watch restart failed (%s); again in %.0fs", kind, exc, delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 30.0)

    async def _list(self, kind: str) -> None:
        res, index, project, selector = self._kinds[kind]
        started = time.monotonic()
        changed = False
        for namespace in self.namespaces or (None,):
            items: list[dict[str, Any]] = []
            params: dict[str, str] = {"limit": str(_LIST_PAGE)}
            if selector:
                params["labelSelector"] = selector
            while True:
                answer = await self.kube.request("GET", res.path(namespace), params=params)
                items.extend(
                    project({**i, "apiVersion": res.api_version, "kind": res.kind}) for i in answer.get("items") or ()
                )
                meta = answer.get("metadata") or {}
                if not meta.get("continue"):
                    break
                params["continue"] = meta["continue"]
            # a paged list is consistent at the first page's resourceVersion, which the last page reports too
            changed |= index.relist(items, int(meta.get("resourceVersion") or 0), namespace=namespace)
        self._listed_at[kind] = started
        if changed:
            for callback in self.on_change:
                callback(kind)
