"""One reconcile of one PipelineTrainingJob: read, decide with the core's pure functions, apply.

Thin by design (the sample-controller's ``syncHandler``): everything the job does is decided by
``pipefill.lifecycle.decide`` from the job and its pods, read fresh from the API server. Errors follow kopf's split:
``kopf.PermanentError`` when the spec can never work (reported as the InvalidSpec condition and an Event, once, and
not retried until the spec changes), ``kopf.TemporaryError`` when a retry will do (a conflict, an API server that
is busy), with the delay it asks for.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from pipefill.lifecycle import Decision, Observed, decide, observe_pod
from pipefill.lifecycle.checks import checkpoint_sharing, spec_problems
from pipefill.lifecycle.conditions import ConditionType, find, rfc3339, set_condition
from pipefill.spec import JobPhase, PipelineTrainingJob, PipelineTrainingJobStatus, SpecError, parse
from pipefill.spec._schema import from_obj
from pipefill_operator.apply import PTJ, RANKS_READY_INTERVAL_S, Applier, post_event
from pipefill_operator.cache import PodIndex, project_object, project_pod
from pipefill_operator.kube import Kube
from pipefill_operator.prerequisites import NodeIndex, Prerequisites
from pipefill_operator.runningspec import RunningSpecs

__all__ = ["Outcome", "Reconciler"]

Key = tuple[str, str]  # (namespace, name)


@dataclass
class Outcome:
    """What one reconcile did: when to look again, the new status, and the seconds spent computing (not waiting)."""

    requeue_after_s: float | None = None
    status: PipelineTrainingJobStatus | None = None
    own_s: float = 0.0
    restarted: str | None = None  # "failure" or "disruption" when this reconcile decided a restart
    pods: list[dict[str, Any]] = field(default_factory=list)
    steps: int | None = None  # spec.steps: the status reader's progress and estimated completion count against it


def _owned(pod: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences") or ())


def _status_of(body: dict[str, Any]) -> PipelineTrainingJobStatus:
    try:
        return from_obj(PipelineTrainingJobStatus, body.get("status") or {})
    except (TypeError, ValueError):  # a status written by someone else; start over from what the pods say
        return PipelineTrainingJobStatus()


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        *,
        pods: PodIndex,
        nodes: NodeIndex | None = None,
        now: Callable[[], datetime.datetime] | None = None,
        on_schedule_csv: Callable[[Key, str | None], None] | None = None,
        admission_warnings: bool = False,
    ) -> None:
        self.kube = kube
        # the chart's ValidatingAdmissionPolicy warns at `kubectl apply` of a job without a checkpoint claim
        self.admission_warnings = admission_warnings
        self.pods = pods  # the rank pods as the watch shows them (and as this operator's creates returned them)
        self.on_schedule_csv = on_schedule_csv  # told each custom schedule's CSV (the fill queue predicts with it)
        self.prereqs = Prerequisites(kube, nodes)
        self.apply = Applier(kube)
        self.running_specs = RunningSpecs(kube)  # what a running gang was built from (SpecChangePending)
        self.now = now or (lambda: datetime.datetime.now(datetime.UTC))
        self._parsed: dict[tuple[str, int], PipelineTrainingJob] = {}
        self._problems: dict[tuple[str, int, str | None], list[str]] = {}
        # objects jobs wait for: (kind, namespace, name) -> job keys (their watches wake them: awaited.py)
        self.waiting_for: dict[tuple[str, str, str], set[Key]] = {}
        self.bodies: dict[Key, dict[str, Any]] = {}  # the latest copy of each job (see remember)

    def remember(self, key: Key, body: dict[str, Any]) -> None:
        """The job as last seen (a watch event, or the answer to a status write): a reconcile starts from it
        instead of reading it again. A stale copy costs one conflict, never a wrong write: the status write is
        preconditioned on its resourceVersion."""
        known = self.bodies.get(key)
        if known is not None and known["metadata"]["uid"] == body["metadata"]["uid"]:
            try:
                if int(known["metadata"]["resourceVersion"]) > int(body["metadata"]["resourceVersion"]):
                    return  # an older event arriving after our own write's answer
            except (KeyError, ValueError):
                pass
        self.bodies[key] = body

    def forget(self, key: Key, uid: str | None = None) -> None:
        self.bodies.pop(key, None)
        for ref, waiters in list(self.waiting_for.items()):
            waiters.discard(key)
            if not waiters:
                del self.waiting_for[ref]
                self.prereqs.seen.pop(ref, None)
        if uid is not None:
            self.apply.forget(uid)
            self.running_specs.forget(uid)
            self._parsed = {k: v for k, v in self._parsed.items() if k[0] != uid}
            self._problems = {k: v for k, v in self._problems.items() if k[0] != uid}

    def _parse(self, body: dict[str, Any]) -> PipelineTrainingJob:
        meta = body["metadata"]
        mark = (meta["uid"], int(meta.get("generation", 1)))
        if mark not in self._parsed:
            obj: dict[str, Any] = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
            try:
                job = parse(obj, source=f"{meta['namespace']}/{meta['name']}")
            except SpecError as exc:
                raise kopf.PermanentError("; ".join(str(e) for e in exc.errors)) from None
            if not isinstance(job, PipelineTrainingJob):
                raise kopf.PermanentError(f"{meta['name']}: expected a PipelineTrainingJob, got {body.get('kind')}")
            self._parsed = {k: v for k, v in self._parsed.items() if k[0] != mark[0]}
            self._parsed[mark] = job
        return self._parsed[mark]

    async def _spec_problems(self, job: PipelineTrainingJob, uid: str, generation: int, csv: str | None) -> list[str]:
        """The operator's checks of a job's spec, once per generation and schedule CSV. They build and check the
        step's schedule (up to 65 536 stage-microbatches, about a second), so in a thread: the event loop goes on
        with the other jobs meanwhile."""
        mark = (uid, generation, csv)
        if mark not in self._problems:
            found = await asyncio.to_thread(spec_problems, job, schedule_csv=csv)
            self._problems = {k: v for k, v in self._problems.items() if k[0] != uid}
            self._problems[mark] = found
        return self._problems[mark]

    async def invalid_unparsed(self, key: Key, message: str) -> None:
        """Report a job whose spec cannot even be read (admission would have refused it; the CRD may be older than
        the operator): InvalidSpec and Failed, once."""
        namespace, name = key
        body = await self.kube.get(PTJ, name, namespace)
        if body is None:
            return
        status = _status_of(body)
        current = find(status.conditions, ConditionType.INVALID_SPEC)
        if current is not None and current.status == "True" and current.message == message:
            return
        new = copy.deepcopy(status)
        now = rfc3339(self.now())
        generation = int(body["metadata"].get("generation", 1))
        new.phase, new.observed_generation = JobPhase.FAILED, generation
        for kind in (ConditionType.INVALID_SPEC, ConditionType.FAILED):
            set_condition(new.conditions, kind, True, "InvalidSpec", message, now=now, generation=generation)
        await self.apply.status(body, status, new)
        await post_event(self.kube, body, "Warning", "InvalidSpec", message)

    async def reconcile(self, key: Key, *, permanent: str | None = None) -> Outcome:
        """Bring job ``key`` one step closer to what its spec and pods call for; ``permanent`` is a PermanentError
        of the previous attempt, decided as InvalidSpec now."""
        namespace, name = key
        body = self.bodies.get(key) or await self.kube.get(PTJ, name, namespace)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.forget(key, None if body is None else body["metadata"]["uid"])
            return Outcome()
        meta = body["metadata"]
        uid, generation = meta["uid"], int(meta.get("generation", 1))
        own = 0.0
        tick = time.perf_counter()
        status = _status_of(body)
        job = self._parse(body)
        own += time.perf_counter() - tick
        pods = [p for p in self.pods.pods_of(key) if _owned(p, uid)]
        csv, waiting = await self.prereqs.schedule_csv(job, namespace)
        ref = job.spec.pipeline.custom_schedule
        if ref is not None and self.on_schedule_csv is not None:
            self.on_schedule_csv(key, csv)
        if waiting is not None and ref is not None:
            self.waiting_for.setdefault(("ConfigMap", namespace, ref.name), set()).add(key)
        tick = time.perf_counter()
        views = [v for v in map(observe_pod, pods) if v is not None]
        problems = list(await self._spec_problems(job, uid, generation, csv))
        own += time.perf_counter() - tick
        if permanent is not None:
            problems.append(permanent)
        before_pods = not views and status.phase not in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.SUSPENDED)
        if waiting is None and not problems and before_pods:
            waiting = await self.prereqs.waiting(job, namespace)
        if waiting is None and not problems and before_pods and (mounts := await self.prereqs.mounts(job, namespace)):
            # pods that mount a missing ConfigMap or claim would hang in ContainerCreating or Pending: wait for
            # each one by its own watch instead
            missing, waiting = mounts
            for obj in missing:
                self.waiting_for.setdefault((obj.kind, namespace, obj.name), set()).add(key)
        checkpoints = None
        if before_pods and not problems:
            checkpoints = checkpoint_sharing(job, await self.prereqs.checkpoint_claim(job, namespace))
            claim = job.spec.checkpoint.claim_name
            if waiting is None and claim is not None and checkpoints[1] == "CheckpointClaimMissing":
                # pods would only sit unschedulable: wait for the claim instead (the PVC watch wakes the job)
                waiting, checkpoints = (checkpoints[1], f"{checkpoints[2]}; the job starts once it exists"), None
                self.waiting_for.setdefault(("PersistentVolumeClaim", namespace, claim), set()).add(key)
        running = await self.running_specs.of(job, namespace=namespace, uid=uid, generation=generation, pods=views)
        tick = time.perf_counter()
        observed = Observed(
            pods=views,
            now=self.now(),
            problems=problems,
            waiting=waiting,
            checkpoints=checkpoints,
            checkpoints_warned_at_admission=self.admission_warnings and job.spec.checkpoint.claim_name is None,
            running_spec=running,
        )
        decision = decide(job, status, observed, job_generation=generation)
        own += time.perf_counter() - tick
        try:
            postponed = await self._apply(key, body, job, status, decision, pods, csv)
        except kopf.TemporaryError:
            self.bodies.pop(key, None)  # a conflict: read the job afresh next time
            raise
        if postponed:
            decision.requeue_after_s = min(decision.requeue_after_s or RANKS_READY_INTERVAL_S, RANKS_READY_INTERVAL_S)
        restarted = None
        if decision.status.restarts > status.restarts:
            restarted = "failure"
        elif decision.status.disruptions > status.disruptions:
            restarted = "disruption"
        return Outcome(decision.requeue_after_s, decision.status, own, restarted, pods, job.spec.steps)

    async def _apply(
        self,
        key: Key,
        body: dict[str, Any],
        job: PipelineTrainingJob,
        status: PipelineTrainingJobStatus,
        decision: Decision,
        pods: list[dict[str, Any]],
        csv: str | None,
    ) -> bool:
        """Apply ``decision``; True when its status write was postponed (look again in RANKS_READY_INTERVAL_S)."""
        written, postponed = await self.apply.status(body, status, decision.status)
        if written is not None:
            self.remember(key, project_object(written))
        # Once the status is written: the Events that tell what it records (a later failure cannot lose them),
        # the deletions and the creations (a decision never has both), all at once.
        _, deleted, created = await asyncio.gather(
            self.apply.events(body, decision),
            self.apply.deletions(body, decision.delete_pods, pods),
            self.apply.pods(job, body, decision, csv),
        )
        # the API server's answers go into the cache at once: the next reconcile, which may come before the watch
        # shows them, must not create the same pods again
        for pod in [*deleted, *created]:
            self.pods.event(project_pod(pod), deleted=False)
        if decision.delete_job:
            await self.apply.delete_job(body)
        return postponed
