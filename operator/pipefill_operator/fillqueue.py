"""The fill queue's one scheduling loop: debounced on FillJob, training-job and pod events plus a period, one
:func:`pipefill.queue.schedule_pass` over the whole index, the outcomes written into FillJob status.

One loop for the whole cluster (Kueue's scheduler is the model), never a handler per object: placements of
different jobs compete for the same ranks, so they are decided together from one snapshot. The kopf handlers only
feed the operator's cache and wake the loop; the cache lists a kind again only when its watch started over
(:mod:`pipefill_operator.cache`), never every period. A cluster without FillJobs costs no pass at all, and the wait
between passes grows with the pass's own duration, so that on a busy cluster the pass takes at most a fifth of a core.
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
from pipefill.queue import POLICIES, now_rfc3339, schedule_pass
from pipefill.queue.outcome import decide
from pipefill_operator.cache import FILLJOB, ClusterCache, project_object
from pipefill_operator.fillindex import FillIndex
from pipefill_operator.kube import ApiError, Kube
from pipefill_operator.metrics import FillQueueMetrics

__all__ = ["FILLJOB", "FillQueue", "QueueConfig"]

log = logging.getLogger("pipefill_operator.fill")

_WRITES_AT_ONCE = 16
_COUNTED = 65536
_PASS_SHARE = 0.2  # the pass's own CPU at most this share of the time between passes


def _key(body: dict[str, Any]) -> tuple[str, str]:
    return str(body["metadata"]["namespace"]), str(body["metadata"]["name"])


@dataclass(frozen=True)
class QueueConfig:
    """The queue's settings (``--policy``, ``--fill-period``; PIPEFILL_FILL_MAX_ACTIVE_JOBS from the environment)."""

    policy: str = "fifo"
    """One of pipefill.queue.POLICIES: how free slots are given out (docs/fill.md)."""
    period_s: float = 30.0
    """A pass at least this often, events or not (deadlines and a FillJob's age change nothing in the cluster)."""
    debounce_s: float = 0.2
    """After an event, wait this long for more before the pass: a burst of events is one pass."""
    max_jobs_per_rank: int = env.DEFAULT_FILL_MAX_ACTIVE_JOBS
    namespaces: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} is not one of {', '.join(POLICIES)}; pick one of them")


class FillQueue:
    def __init__(
        self, kube: Kube, metrics: FillQueueMetrics, config: QueueConfig, *, cache: ClusterCache | None = None
    ) -> None:
        self.kube, self.metrics, self.config = kube, metrics, config
        self.cache = cache or ClusterCache(kube, namespaces=config.namespaces)
        self.index = FillIndex(
            fill_jobs=self.cache.fill_jobs, training_jobs=self.cache.training_jobs, pods=self.cache.pods
        )
        self.cache.on_change.append(lambda _kind: self.wake())
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        self.own_s = 0.0  # the last pass's own time (snapshot, decisions), not its waits on the API server
        self._counted: OrderedDict[tuple[str, int], None] = OrderedDict()  # releases counted (job uid, epoch)

    # -- woken by the kopf handlers -------------------------------------------------------------------------------
    def wake(self) -> None:
        """Something the pass reads changed (the handlers fed the cache)."""
        self._wake.set()

    def schedule_csv(self, key: tuple[str, str], csv: str | None) -> None:
        """The custom schedule of training job ``key`` as its reconcile read it from the user's ConfigMap (None: not
        found yet): the prediction of the bubbles of its ranks that have reported none needs it."""
        if self.index.schedule_csvs.get(key) != csv:
            if csv is None:
                self.index.schedule_csvs.pop(key, None)
            else:
                self.index.schedule_csvs[key] = csv
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
        while not self.cache.seeded:  # the controller seeds the cache before it starts this loop; a test may not
            try:
                await self.cache.seed()
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
                await asyncio.sleep(max(self.config.debounce_s, self.own_s * (1 - _PASS_SHARE) / _PASS_SHARE))
            except TimeoutError:
                pass
            self._wake.clear()

    # -- one pass --------------------------------------------------------------------------------------------------
    async def pass_once(self) -> None:
        """Decide from the index and write what changed."""
        bodies = self.index.fill_job_bodies()
        if not bodies:  # nothing to place, release or report: the gauges say so, and the pass is skipped
            self._gauges({})
            return
        tick = time.perf_counter()
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
        self.own_s = time.perf_counter() - tick
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
        self.index.fill_jobs.event(project_object(answer), deleted=False)
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
