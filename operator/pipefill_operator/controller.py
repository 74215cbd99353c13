"""The operator's moving parts: kopf's watches feed one work queue, workers reconcile, a reader fills in status.

kopf handlers only route events to job keys (:mod:`pipefill_operator.handlers`); the workers here take keys off the
queue one at a time per job and call :class:`~pipefill_operator.reconcile.Reconciler`. Outcomes turn into
metrics, delayed re-adds (deadlines, TTLs, retries) and the set of running jobs whose pods the status reader scrapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from dataclasses import dataclass
from typing import Any

import kopf

from pipefill.lifecycle.conditions import rfc3339
from pipefill.spec import JobPhase
from pipefill_operator.apply import PTJ
from pipefill_operator.awaited import AwaitedObjects
from pipefill_operator.cache import ClusterCache
from pipefill_operator.fillqueue import FillQueue
from pipefill_operator.kube import ApiError, Kube, resource_of
from pipefill_operator.metrics import OperatorMetrics
from pipefill_operator.prerequisites import NodeIndex
from pipefill_operator.reconcile import Key, Outcome, Reconciler
from pipefill_operator.statusreader import JobFigures, StatusReader, job_progress, paced, scrape_targets
from pipefill_operator.workqueue import Backoff, WorkQueue

__all__ = ["POD_BATCH_S", "Controller", "OperatorConfig"]

log = logging.getLogger("pipefill_operator")

POD_BATCH_S = 0.25
"""A job's reconcile waits this long after the first event of one of its pods for the rest of the burst: the
scheduler binds a gang's pods together and they start together, and a reconcile per pod event was 11 000
reconciles for 1 000 jobs of 8 ranks (each reading the job's pods and deciding anew, for nothing new)."""


@dataclass(frozen=True)
class OperatorConfig:
    """Settings of ``python -m pipefill_operator`` (each has a command-line flag)."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to serve; empty: all of them (cluster-wide, the node watch included)."""
    workers: int = 8
    """Reconciles running at once (of different jobs; one job is never reconciled twice at a time)."""
    status_interval_s: float = 30.0
    """How often each running job's pods' metrics endpoints are read for status (the bounded rate)."""
    status_timeout_s: float = 2.0
    """A metrics endpoint that has not answered after this long is left out of that read."""
    status_concurrency: int = 16
    """Metrics endpoints read at once, over all jobs."""
    status_rate: float = 100.0
    """Metrics endpoints read per second at most, over all jobs: a round over every running job then takes at least
    endpoints ÷ rate seconds (8 000 rank pods, 16 000 endpoints: 160 s), so the operator's CPU for status stays
    bounded however large the cluster (a read costs a few ms of parsing)."""
    admission_warnings: bool = False
    """The chart's ValidatingAdmissionPolicy is installed: it warns at ``kubectl apply`` of a job without a
    checkpoint claim, so the operator records that in the CheckpointsShared condition without an Event."""

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces


class Controller:
    def __init__(
        self,
        kube: Kube,
        metrics: OperatorMetrics,
        config: OperatorConfig,
        *,
        fill: FillQueue | None = None,
        cache: ClusterCache | None = None,
    ) -> None:
        self.kube, self.metrics, self.config = kube, metrics, config
        self.fill = fill  # the FillJob queue's scheduling loop (None: the operator does not schedule FillJobs)
        # what the watches show of pods and jobs (the fill queue's, when there is one: one cache for both)
        self.cache = cache or (fill.cache if fill is not None else ClusterCache(kube, namespaces=config.namespaces))
        kube.on_request = metrics.api_request
        self.queue = WorkQueue()
        self.backoff = Backoff()
        self.nodes = NodeIndex() if config.clusterwide else None
        self.reconciler = Reconciler(
            kube,
            pods=self.cache.pods,
            nodes=self.nodes,
            on_schedule_csv=fill.schedule_csv if fill is not None else None,
            admission_warnings=config.admission_warnings,
        )
        # a watch of each ConfigMap or claim some job waits for, and of no other
        self.awaited = AwaitedObjects(kube, self.object_changed, seen=self.reconciler.prereqs.seen)
        self.reader = StatusReader(timeout_s=config.status_timeout_s, concurrency=config.status_concurrency)
        self.running: dict[Key, list[dict[str, Any]]] = {}  # running jobs -> their pods, for the status reader
        self.waiting: set[Key] = set()  # jobs in phase Waiting (a node offering a resource wakes them)
        self._figures: dict[Key, JobFigures] = {}
        self.planned_steps: dict[Key, int | None] = {}  # spec.steps of each running job
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.cache.seeded:
            # a reconcile decides from the cache: before its first list, an absent pod is only one not seen yet
            await self.cache.seed()
        if self.nodes is not None and not self.nodes.seeded:
            # One list before any reconcile, so no job waits for a GPU only because the node watch is still starting.
            for node in await self.kube.list(resource_of("v1", "Node")):
                self.nodes.update(node)
            self.nodes.seeded = True
        self._tasks = [asyncio.create_task(self._worker(), name=f"reconcile-{i}") for i in range(self.config.workers)]
        self._tasks.append(asyncio.create_task(self._read_status(), name="status-reader"))
        if self.fill is not None:
            await self.fill.start()

    async def stop(self) -> None:
        if self.fill is not None:
            await self.fill.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.queue.close()
        await self.awaited.close()
        await self.cache.close()
        await self.reader.close()
        await self.kube.close()

    # -- routing (called by the kopf handlers) ---------------------------------------------------------------------
    def enqueue(self, key: Key) -> None:
        self.queue.add(key)
        self.metrics.queue_depth.set(len(self.queue))

    def pod_changed(self, key: Key) -> None:
        """A rank pod of job ``key`` changed: reconcile once the burst it belongs to is in (POD_BATCH_S)."""
        self.queue.add_batched(key, POD_BATCH_S)
        self.metrics.queue_depth.set(len(self.queue))

    def job_changed(self, key: Key, body: dict[str, Any]) -> None:
        self.reconciler.remember(key, body)
        self.enqueue(key)

    def job_deleted(self, key: Key, uid: str | None) -> None:
        self.queue.forget(key)
        self.reconciler.forget(key, uid)
        self.running.pop(key, None)
        self.waiting.discard(key)
        self._figures.pop(key, None)
        self.metrics.set_phase(key, None)
        self.awaited.sync(self.reconciler.waiting_for)

    def object_changed(self, kind: str, namespace: str, name: str) -> None:
        """A ConfigMap or PersistentVolumeClaim some job waits for appeared or changed: wake those jobs (their
        reconciles say again what they wait for)."""
        for key in self.reconciler.waiting_for.pop((kind, namespace, name), set()):
            self.enqueue(key)
        self.awaited.sync(self.reconciler.waiting_for)

    def node_changed(self, node: Any, *, deleted: bool) -> None:
        if self.nodes is not None and self.nodes.update(node, deleted=deleted):
            for key in list(self.waiting):
                self.enqueue(key)

    # -- workers ---------------------------------------------------------------------------------------------------
    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self._process(key)  # type: ignore[arg-type]
            finally:
                self.queue.done(key)
                self.metrics.queue_depth.set(len(self.queue))

    async def _process(self, key: Key) -> None:
        started = time.perf_counter()
        result, outcome = "ok", None
        try:
            try:
                outcome = await self.reconciler.reconcile(key)
            except kopf.PermanentError as exc:
                result = "invalid"
                try:
                    outcome = await self.reconciler.reconcile(key, permanent=str(exc))
                except kopf.PermanentError as again:
                    await self.reconciler.invalid_unparsed(key, str(again))
        except kopf.TemporaryError as exc:
            result = "retry"
            self.queue.add_after(key, exc.delay if exc.delay is not None else 1.0)
        except (ApiError, TimeoutError) as exc:
            result = "retry"
            log.warning("reconcile of %s/%s: %s", *key, exc)
            self.queue.add_after(key, self.backoff.next_delay_s(key))
        except Exception:
            result = "error"
            log.exception("reconcile of %s/%s failed", *key)
            self.queue.add_after(key, self.backoff.next_delay_s(key))
        else:
            self.backoff.reset(key)
        self.metrics.record(
            result=result, duration_s=time.perf_counter() - started, own_s=outcome.own_s if outcome else 0.0
        )
        if outcome is not None:
            self._after(key, outcome)

    def _after(self, key: Key, outcome: Outcome) -> None:
        self.awaited.sync(self.reconciler.waiting_for)
        if outcome.requeue_after_s is not None:
            self.queue.add_after(key, outcome.requeue_after_s)
        if outcome.restarted is not None:
            self.metrics.restarts.labels(outcome.restarted).inc()
        phase = outcome.status.phase if outcome.status is not None else None
        self.metrics.set_phase(key, None if phase is None else phase.value)
        if phase == JobPhase.RUNNING:
            self.running[key] = outcome.pods
            self.planned_steps[key] = outcome.steps
        else:
            self.running.pop(key, None)
            self.planned_steps.pop(key, None)
        if phase == JobPhase.WAITING:
            self.waiting.add(key)
        else:
            self.waiting.discard(key)

    # -- status from the ranks -------------------------------------------------------------------------------------
    async def _read_status(self) -> None:
        """Rounds over the running jobs, ``status_interval_s`` apart, each paced to ``status_rate`` endpoints a
        second: a job's read starts once the endpoints started before it are due at that rate."""

        def endpoints(key: Key) -> int:
            return len(scrape_targets(self.running.get(key) or ()))

        while True:
            await asyncio.sleep(self.config.status_interval_s)
            reads = []
            async for key in paced(list(self.running), endpoints, self.config.status_rate):
                pods = self.running.get(key)
                if pods is not None:  # still running by its turn
                    reads.append(asyncio.create_task(self._read_job(key, pods)))
            await asyncio.gather(*reads)

    async def _read_job(self, key: Key, pods: list[dict[str, Any]]) -> None:
        figures, answered, failed = await self.reader.read(pods)
        self.metrics.status_reads.labels("ok").inc(answered)
        self.metrics.status_reads.labels("error").inc(failed)
        if answered == 0 or figures == self._figures.get(key) or key not in self.running:  # (ended meanwhile)
            return
        percent, eta_s = job_progress(figures, self.planned_steps.get(key), time.time())
        patch = {
            "currentStep": figures.current_step,
            "bubbleFraction": figures.bubble_fraction,
            "fillUtilization": figures.fill_utilization,
            "loss": figures.loss,
            "progress": percent,
            "estimatedCompletionTime": None
            if eta_s is None
            else rfc3339(datetime.datetime.fromtimestamp(eta_s, datetime.UTC)),
        }
        namespace, name = key
        try:
            await self.kube.merge_patch(
                PTJ, name, {"status": {k: v for k, v in patch.items() if v is not None}}, namespace, sub="status"
            )
        except (ApiError, TimeoutError) as exc:
            log.warning("status of %s/%s from its ranks: %s", namespace, name, exc)
            return
        self._figures[key] = figures
