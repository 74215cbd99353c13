"""The fill queue's one scheduling loop: debounced on FillJob, training-job and pod events plus a period, one
:func:`pipefill.queue.schedule_pass` over the whole index, the outcomes written into FillJob status.

One loop for the whole cluster (Kueue's scheduler is the model), never a handler per object: placements of
different jobs compete for the same ranks, so they are decided together from one snapshot. The kopf handlers only
feed the index and wake the loop. Each period the loop also lists every kind again, which repairs an index that
missed an event (a pod deleted while the watch reconnected) — the only way a gone pod could otherwise stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from pipefill import env
from pipefill.children import JOB_LABEL
from pipefill.queue import POLICIES, now_rfc3339, schedule_pass
from pipefill_operator.fillindex import FillIndex, ObjectIndex
from pipefill_operator.filloutcome import decide
from pipefill_operator.kube import ApiError, Kube, resource_of
from pipefill_operator.metrics import FillQueueMetrics

__all__ = ["FILLJOB", "FillQueue", "QueueConfig"]

log = logging.getLogger("pipefill_operator.fill")

FILLJOB = resource_of("pipefill.io/v1alpha1", "FillJob")
_PTJ = resource_of("pipefill.io/v1alpha1", "PipelineTrainingJob")
_POD = resource_of("v1", "Pod")
_WRITES_AT_ONCE = 16
_COUNTED = 65536


def _key(body: dict[str, Any]) -> tuple[str, str]:
    return str(body["metadata"]["namespace"]), str(body["metadata"]["name"])


@dataclass(frozen=True)
class QueueConfig:
    """The queue's settings (``--policy``, ``--fill-period``; PIPEFILL_FILL_MAX_ACTIVE_JOBS from the environment)."""

    policy: str = "fifo"
    """One of pipefill.queue.POLICIES: how free slots are given out (docs/fill.md)."""
    period_s: float = 30.0
    """A pass (and a fresh list of every kind) at least this often, events or not."""
    debounce_s: float = 0.2
    """After an event, wait this long for more before the pass: a burst of events is one pass."""
    max_jobs_per_rank: int = env.DEFAULT_FILL_MAX_ACTIVE_JOBS
    namespaces: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} is not one of {', '.join(POLICIES)}; pick one of them")


class FillQueue:
    def __init__(self, kube: Kube, metrics: FillQueueMetrics, config: QueueConfig) -> None:
        self.kube, self.metrics, self.config = kube, metrics, config
        self.index = FillIndex()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        self._listed_at = 0.0
        self._counted: OrderedDict[tuple[str, int], None] = OrderedDict()  # releases counted (job uid, epoch)

    # -- fed by the kopf handlers ----------------------------------------------------------------------------------
    def fill_job_event(self, body: dict[str, Any], *, deleted: bool) -> None:
        self._event(self.index.fill_jobs, body, deleted)

    def training_job_event(self, body: dict[str, Any], *, deleted: bool) -> None:
        self._event(self.index.training_jobs, body, deleted)

    def pod_event(self, body: dict[str, Any], *, deleted: bool) -> None:
        self._event(self.index.pods, body, deleted)

    def schedule_csv(self, key: tuple[str, str], csv: str | None) -> None:
        """The custom schedule of training job ``key`` as its reconcile read it from the user's ConfigMap (None: not
        found yet): the prediction of the bubbles of its ranks that have reported none needs it."""
        if self.index.schedule_csvs.get(key) != csv:
            if csv is None:
                self.index.schedule_csvs.pop(key, None)
            else:
                self.index.schedule_csvs[key] = csv
            self._wake.set()

    def _event(self, index: ObjectIndex, body: dict[str, Any], deleted: bool) -> None:
        if index.event(body, deleted=deleted):
            self._wake.set()

    # -- lifecycle -------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="fill-queue")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        delay_s = 0.5
        while not self.index.seeded:
            try:
                await self._relist()
                self.index.seeded = True
            except (ApiError, TimeoutError) as exc:
                log.warning("fill queue: listing the cluster failed (%s); again in %.1fs", exc, delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 30.0)
        while True:
            try:
                await self.pass_once()
            except (ApiError, TimeoutError) as exc:
                log.warning("fill queue: pass failed (%s); again at the next event or period", exc)
            except Exception:
                log.exception("fill queue: pass failed")
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.config.period_s)
                await asyncio.sleep(self.config.debounce_s)
            except TimeoutError:
                pass
            if time.monotonic() - self._listed_at >= self.config.period_s:  # also on a cluster never quiet
                with contextlib.suppress(ApiError, TimeoutError):
                    await self._relist()
            self._wake.clear()

    async def _relist(self) -> None:
        where: tuple[str | None, ...] = self.config.namespaces or (None,)
        for namespace in where:
            for res, index, selector in (
                (FILLJOB, self.index.fill_jobs, None),
                (_PTJ, self.index.training_jobs, None),
                (_POD, self.index.pods, JOB_LABEL),
            ):
                params = {"labelSelector": selector} if selector else None
                answer = await self.kube.request("GET", res.path(namespace), params=params)
                items = [
                    {**item, "apiVersion": res.api_version, "kind": res.kind} for item in answer.get("items") or ()
                ]
                rv = int((answer.get("metadata") or {}).get("resourceVersion") or 0)
                index.relist(items, rv, namespace=namespace)
        self._listed_at = time.monotonic()

    # -- one pass --------------------------------------------------------------------------------------------------
    async def pass_once(self) -> None:
        """Decide from the index and write what changed."""
        bodies = self.index.fill_job_bodies()
        held_back = {
            _key(b) for b in bodies if (b.get("spec") or {}).get("suspend") or (b.get("spec") or {}).get("cancel")
        }
        snapshot = self.index.snapshot(suspended=held_back)
        started = time.perf_counter()
        result = schedule_pass(snapshot, policy=self.config.policy, max_jobs_per_rank=self.config.max_jobs_per_rank)
        self.metrics.pass_duration.labels(self.config.policy).observe(time.perf_counter() - started)
        self.passes += 1
        hosts = {t.key for t in snapshot.training_jobs if t.running}
        now = now_rfc3339()
        writes = []
        for body in bodies:
            try:
                decision = decide(body, result.jobs.get(_key(body)), running_hosts=hosts, now=now)
            except (ValueError, KeyError, TypeError) as exc:  # a status someone wrote out of shape: the others go on
                log.warning("fill queue: FillJob %s/%s: status not understood: %s", *_key(body), exc)
                continue
            if decision.patch is not None:
                writes.append((body, decision))
        # the metrics say what the pass decided before the writes make it visible; a release is counted once
        # (by job uid and epoch), though a conflict makes the next pass decide it again
        self._gauges({_key(b): {**(b.get("status") or {}), **(d.patch or {})} for b, d in writes})
        for body, decision in writes:
            for placement, reason in decision.released:
                mark = (str(body["metadata"]["uid"]), placement.epoch)
                if mark not in self._counted:
                    self._counted[mark] = None
                    self.metrics.reassignments.labels(reason).inc()
        while len(self._counted) > _COUNTED:
            self._counted.popitem(last=False)
        limit = asyncio.Semaphore(_WRITES_AT_ONCE)

        async def write(body: dict[str, Any], patch: dict[str, Any]) -> None:
            async with limit:
                await self._write(body, patch)

        await asyncio.gather(*(write(b, d.patch) for b, d in writes if d.patch is not None))

    async def _write(self, body: dict[str, Any], patch: dict[str, Any]) -> bool:
        meta = body["metadata"]
        # the resourceVersion makes the patch conditional: an executor's commit since the index's copy wins
        payload = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": patch}
        try:
            answer = await self.kube.merge_patch(FILLJOB, meta["name"], payload, meta["namespace"], sub="status")
        except ApiError as exc:
            if exc.status == 409:  # changed since: the watch brings the new copy, and the next pass starts from it
                self._wake.set()
            elif exc.status != 404:
                log.warning("fill queue: status of FillJob %s/%s not written: %s", meta["namespace"], meta["name"], exc)
            return False
        self.index.fill_jobs.event(answer, deleted=False)
        return True

    def _gauges(self, changed: dict[tuple[str, str], dict[str, Any]]) -> None:
        """Set the gauges from every FillJob's status: the index's, or ``changed`` ones as the pass wrote them."""
        phases: dict[str, int] = {}
        waiting = assigned = 0
        statuses = {_key(b): (b.get("status") or {}, b.get("spec") or {}) for b in self.index.fill_job_bodies()}
        for key, st in changed.items():
            statuses[key] = (st, statuses[key][1])
        for st, spec in statuses.values():
            phase = str(st.get("phase") or "Queued")
            phases[phase] = phases.get(phase, 0) + 1
            assigned += len(st.get("assignments") or ())
            if phase == "Queued" and not spec.get("suspend"):
                waiting += 1
        self.metrics.queue_length.set(waiting)
        self.metrics.assignments.set(assigned)
        self.metrics.phases(phases)
