"""Apply a lifecycle decision to the cluster, in the order that keeps it safe to stop at any point.

The status goes first, with the job's resourceVersion as a precondition: a restart is on record (its generation and
count) before any pod is deleted, and two writers can never both record one (the second gets a conflict and
re-reads). Then, at once: the Events that describe it, deletions (each with the pod's uid as a precondition), and the
children the pods reference followed by the pods. Creates are idempotent by name.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import logging
import os
import socket
import time
import uuid
from typing import Any

import kopf

from pipefill import env
from pipefill.children import Owner, desired_children, fill_rbac, spec_document
from pipefill.lifecycle import Decision
from pipefill.lifecycle.conditions import rfc3339
from pipefill.pods import rank_pod
from pipefill.spec import JobPhase, PipelineTrainingJob, PipelineTrainingJobStatus, to_obj
from pipefill_operator.kube import ApiError, Kube, resource_of

__all__ = ["COMPONENT", "Applier", "post_event", "status_patch"]

log = logging.getLogger("pipefill_operator")
COMPONENT = "pipefill-operator"

PTJ = resource_of("pipefill.io/v1alpha1", "PipelineTrainingJob")
POD = resource_of("v1", "Pod")
CONFIG_MAP = resource_of("v1", "ConfigMap")
# A gang that starts over minutes (a busy scheduler) writes its progress this often: at 8 000 rank pods starting at
# once, 5 s cost 0.7 status writes a job more than the two every job needs, and 30 s still 0.34 at 1 200 pods on a
# loaded machine (docs/benchmarks.md, #29)
RANKS_READY_INTERVAL_S = 60.0
# The fields the status reader owns; a reconcile never writes them.
READER_FIELDS = ("currentStep", "bubbleFraction", "fillUtilization")


def status_patch(old: PipelineTrainingJobStatus, new: PipelineTrainingJobStatus) -> dict[str, Any]:
    """A merge patch turning ``old`` into ``new``: changed fields only (null removes one)."""
    before, after = to_obj(old), to_obj(new)
    patch: dict[str, Any] = {k: v for k, v in after.items() if before.get(k) != v}
    patch.update({k: None for k in before if k not in after})
    if new.phase != JobPhase.SUCCEEDED:  # the reader stops with the job: a success writes the final step
        for key in READER_FIELDS:
            patch.pop(key, None)
    return patch


def _temporary(exc: ApiError) -> kopf.TemporaryError:
    delay_s = 0.2 if exc.status == 409 else 2.0
    return kopf.TemporaryError(str(exc), delay=delay_s)


class Applier:
    """Writes for one reconcile; remembers which jobs' children exist so steady reconciles write nothing."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        # the queue's limit of fill jobs per rank (fillqueue.py reads the same variable), given to the executors
        self.max_active_jobs = env.fill_max_active_jobs() if os.environ.get(env.FILL_MAX_ACTIVE_JOBS) else None
        self._ensured: set[tuple[str, int, str]] = set()  # (uid, metadata.generation, schedule CSV digest)
        self._written: dict[str, float] = {}  # uid -> monotonic time of the last status write
        self._identities: set[str] = set()  # namespaces whose fill identity this operator has made sure of
        self._identity_locks: dict[str, asyncio.Lock] = {}

    def forget(self, uid: str) -> None:
        self._ensured = {e for e in self._ensured if e[0] != uid}
        self._written.pop(uid, None)

    async def status(
        self, body: dict[str, Any], old: PipelineTrainingJobStatus, new: PipelineTrainingJobStatus
    ) -> tuple[dict[str, Any] | None, bool]:
        """Write the changed fields: (the job as the API server returned it, or None when nothing was written;
        whether the write was postponed).

        A change of ``ranksReady`` alone, within ``RANKS_READY_INTERVAL_S`` of the job's last write, waits: while a
        gang starts, each rank would otherwise cost a write of its own; postponed, the caller looks again then. The
        answer is this call's own: reconciles of other jobs run at the same time on the same Applier."""
        patch = status_patch(old, new)
        if not patch:
            return None, False
        meta = body["metadata"]
        now = time.monotonic()
        if set(patch) <= {"ranksReady"} and now - self._written.get(meta["uid"], 0.0) < RANKS_READY_INTERVAL_S:
            return None, True
        try:
            written = await self.kube.merge_patch(
                PTJ,
                meta["name"],
                {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": patch},
                meta["namespace"],
                sub="status",
            )
        except ApiError as exc:
            raise _temporary(exc) if exc.status in (409, 429) or exc.status >= 500 else exc from None
        self._written[meta["uid"]] = now
        return written, False

    async def _identity(self, namespace: str) -> None:
        """The namespace's fill identity (ServiceAccount, Role, then RoleBinding: RBAC checks a RoleBinding against
        its Role), made sure of once per namespace by this operator; creating an existing one is a no-op."""
        if namespace in self._identities:
            return
        async with self._identity_locks.setdefault(namespace, asyncio.Lock()):
            if namespace in self._identities:
                return  # another job's reconcile did it while this one waited
            account, role, binding = fill_rbac(namespace=namespace)
            await asyncio.gather(self._create(account), self._create(role))
            await self._create(binding)
            self._identities.add(namespace)

    async def _children(self, job: PipelineTrainingJob, body: dict[str, Any], csv: str | None, document: str) -> None:
        """Create what the pods reference (the fill identity, the ServiceAccount's namespace's; the PodGroup). A
        spec ConfigMap, where the job has one (children.spec_in_config_map), is brought up to date when the spec
        changed; the pods' own spec annotations need nothing: each pod is created with its job's spec of the time."""
        meta = body["metadata"]
        digest = hashlib.sha256((csv or "").encode()).hexdigest()[:16]
        mark = (meta["uid"], int(meta.get("generation", 1)), digest)
        if mark in self._ensured:
            return
        owner = Owner(name=meta["name"], uid=meta["uid"])
        objs = desired_children(job, namespace=meta["namespace"], owner=owner, schedule_csv=csv, document=document)
        created, _ = await asyncio.gather(
            asyncio.gather(*(self._create(o) for o in objs)), self._identity(meta["namespace"])
        )
        for obj, made in zip(objs, created, strict=True):
            if made is None and obj["kind"] == "ConfigMap":
                await self.kube.merge_patch(
                    CONFIG_MAP, obj["metadata"]["name"], {"data": obj["data"]}, meta["namespace"]
                )
        self._ensured.add(mark)

    async def _create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return await self.kube.create(obj)
        except ApiError as exc:
            if exc.status == 422:  # the API server refuses what the spec asks for (an affinity, a volume source)
                kind, name = obj["kind"], obj["metadata"]["name"]
                raise kopf.PermanentError(f"{kind} {name!r} was refused by the API server: {exc.message}") from None
            raise _temporary(exc) if exc.status in (403, 409, 429) or exc.status >= 500 else exc from None

    async def pods(
        self, job: PipelineTrainingJob, body: dict[str, Any], decision: Decision, csv: str | None
    ) -> list[dict[str, Any]]:
        """The children the pods reference, then the pods (two rounds of parallel requests); the pods created."""
        if not decision.create_ranks:
            return []
        document = spec_document(job)  # once for the gang: every rank's pod carries it (or its ConfigMap does)
        await self._children(job, body, csv, document)
        meta = body["metadata"]
        owner = Owner(name=meta["name"], uid=meta["uid"])
        gen = decision.status.generation
        manifests = [
            rank_pod(
                job,
                r,
                namespace=meta["namespace"],
                generation=gen,
                owner=owner,
                document=document,
                spec_generation=int(meta.get("generation") or 0),
                max_active_jobs=self.max_active_jobs,
            )
            for r in decision.create_ranks
        ]
        made = await asyncio.gather(*(self._create(obj) for obj in manifests))
        return [obj for obj in made if obj is not None and obj.get("kind") == "Pod"]

    async def deletions(
        self, body: dict[str, Any], names: list[str], pods: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Delete the pods ``names``; the ones the API server answered with (marked for deletion)."""
        uids = {p["metadata"]["name"]: p["metadata"].get("uid") for p in pods}
        namespace = body["metadata"]["namespace"]
        answers = await asyncio.gather(*(self.kube.delete(POD, name, namespace, uid=uids.get(name)) for name in names))
        return [a for a in answers if a is not None and a.get("kind") == "Pod"]

    async def delete_job(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        await self.kube.delete(PTJ, meta["name"], meta["namespace"], uid=meta["uid"])

    async def events(self, body: dict[str, Any], decision: Decision) -> None:
        await asyncio.gather(*(post_event(self.kube, body, e.type, e.reason, e.message) for e in decision.events))


async def post_event(kube: Kube, body: dict[str, Any], kind: str, reason: str, message: str) -> None:
    """A core/v1 Event on the job (what ``kubectl describe`` shows); a failure to post is logged, never fatal."""
    meta = body["metadata"]
    now = rfc3339(datetime.datetime.now(datetime.UTC))
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": body["apiVersion"],
            "kind": body["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": kind,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": socket.gethostname(),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        await kube.create(event)
    except (ApiError, TimeoutError) as exc:
        log.warning("event %s on %s/%s not posted: %s", reason, meta["namespace"], meta["name"], exc)
