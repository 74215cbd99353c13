"""The lifecycle of a PipelineTrainingJob as one pure function: (spec, status, observed pods) -> what to do.

The gang is the unit. Every start of the whole job is a *generation*: its pods carry the label ``pipefill.io/generation``
and the names ``<job>-<rank>`` every generation reuses. :func:`decide` reads the current status and the pods and
returns the next status, the pods to create or delete, the Events to post and when to look again. The operator applies a decision in that order — status first — so a restart is recorded (``generation`` and
``restarts`` raised, phase Restarting) before the old pods are deleted: an operator killed half-way continues
the same restart instead of starting another. A new generation's pods are created only once no pod of an older one
is left, so names, hostnames and the rendezvous on ``MASTER_ADDR`` are free to reuse.

Trainer exits are classified by :mod:`pipefill.lifecycle.exitcodes`, as ``pipefill local`` does. A non-retryable
exit of any rank fails the job whatever its peers did; a retryable one restarts the gang up to
``runPolicy.backoffLimit`` times; an eviction, a preemption or a lost pod restarts it without counting. Fill-executor
restarts never fail the job; they are counted and reported, and where nobody else restarts an executor that exited
(``pipefill local``, which plays the kubelet) the decision says when (:mod:`pipefill.lifecycle.sidecars`).
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipefill.lifecycle.conditions import ConditionType as C
from pipefill.lifecycle.conditions import find, is_true, rfc3339, set_condition
from pipefill.lifecycle.exitcodes import ExitClass, classify, exit_text
from pipefill.lifecycle.images import start_blocked
from pipefill.lifecycle.observe import PodView
from pipefill.lifecycle.sidecars import fill_restarts_due, restarted_text
from pipefill.lifecycle.specchange import spec_change
from pipefill.spec import JobPhase, PipelineTrainingJob, PipelineTrainingJobStatus

__all__ = ["Decision", "Event", "Observed", "decide"]

# Looked at again this often while nothing else would wake the reconcile (a Waiting job also wakes on its watch).
_WAITING_RECHECK_S = 60.0


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the job."""

    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What the operator (or a test) saw: the job's pods and facts the spec alone does not tell."""

    pods: Sequence[PodView]
    now: datetime.datetime
    problems: Sequence[str] = ()  # InvalidSpec: each names the field, the value, the rule and the fix
    waiting: tuple[str, str] | None = None  # (reason, message): something the job needs does not exist yet
    checkpoints: tuple[bool, str, str] | None = None  # (shared, reason, message) of the checkpoint volume
    # the checkpoint warning was already shown to whoever applied the job, by the chart's ValidatingAdmissionPolicy
    # (its Warn action): the condition records it, an Event would tell it twice (and cost a request a job)
    checkpoints_warned_at_admission: bool = False
    # the spec the running pods were built from (to_obj's form), where known: SpecChangePending names the fields
    running_spec: Mapping[str, object] | None = None


@dataclass
class Decision:
    """What to do, in this order: write ``status``, delete, create, post events; look again after ``requeue_after_s``."""

    status: PipelineTrainingJobStatus
    create_ranks: list[int] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after_s: float | None = None
    delete_job: bool = False
    restart_fill: list[int] = field(default_factory=list)
    """ranks whose fill executor starts again now (pipefill local; the kubelet's part on a cluster: sidecars.py)"""


@dataclass(frozen=True)
class _Failure:
    rank: int
    pod: str
    text: str
    kind: ExitClass | None  # None: a disruption


def _parse_time(text: str | None) -> datetime.datetime | None:
    return None if text is None else datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


class _Step:
    def __init__(
        self, job: PipelineTrainingJob, status: PipelineTrainingJobStatus, obs: Observed, job_gen: int
    ) -> None:
        self.job, self.obs, self.job_gen = job, obs, job_gen
        self.now = rfc3339(obs.now)
        self.d = Decision(status=copy.deepcopy(status))
        self.s = self.d.status
        self.s.observed_generation = job_gen

    # -- small helpers -------------------------------------------------------------------------------------------
    def cond(self, kind: str, status: bool, reason: str, message: str = "") -> None:
        set_condition(self.s.conditions, kind, status, reason, message, now=self.now, generation=self.job_gen)

    def clear(self, kind: str, reason: str, message: str = "") -> None:
        """Set ``kind`` False only if it exists (absent conditions stay absent)."""
        if find(self.s.conditions, kind) is not None:
            self.cond(kind, False, reason, message)

    def event(self, kind: str, reason: str, message: str) -> None:
        self.d.events.append(Event(kind, reason, message))

    def requeue(self, after_s: float) -> None:
        after_s = max(after_s, 0.0)
        self.d.requeue_after_s = after_s if self.d.requeue_after_s is None else min(self.d.requeue_after_s, after_s)

    def delete(self, pods: Sequence[PodView]) -> None:
        self.d.delete_pods.extend(p.name for p in pods if not p.deleting)

    def live(self, pods: Sequence[PodView]) -> list[PodView]:
        """Pods still holding resources: not terminated and not already being deleted."""
        return [p for p in pods if p.phase not in ("Succeeded", "Failed")]

    def finish(self, phase: JobPhase, reason: str, message: str) -> None:
        succeeded = phase == JobPhase.SUCCEEDED
        self.s.phase = phase
        self.s.completion_time = self.now
        self.final_figures()
        self.s.ranks_ready = 0
        self.cond(C.SUCCEEDED if succeeded else C.FAILED, True, reason, message)
        self.clear(C.RUNNING, reason, message)
        self.clear(C.RESTARTING, reason)
        self.event("Normal" if succeeded else "Warning", reason, message)
        self.delete(self.live(self.obs.pods))
        self.ttl()

    def final_figures(self) -> None:
        """A finished job has no completion estimate; one our trainer finished is at spec.steps, 100 %: the ranks'
        metrics, read every few seconds while it runs, stop short when the trainers end between two reads (a read
        that raced the end is set right at the next reconcile). A command's steps are its own: left as read."""
        self.s.estimated_completion_time = None
        if self.s.phase == JobPhase.SUCCEEDED and self.job.spec.trainer is None:
            self.s.current_step, self.s.progress = self.job.spec.steps, 100.0

    def ttl(self) -> None:
        ttl_s = self.job.spec.run_policy.ttl_seconds_after_finished
        done = _parse_time(self.s.completion_time)
        if ttl_s is None or done is None:
            return
        left_s = (done - self.obs.now).total_seconds() + ttl_s
        if left_s <= 0:
            self.d.delete_job = True
        else:
            self.requeue(left_s)

    # -- the steps -------------------------------------------------------------------------------------------------
    def run(self) -> Decision:
        self.adopt_newer_generation()
        self.reopen_if_spec_fixed()
        if self.s.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED):
            self.final_figures()
            self.delete(self.live(self.obs.pods))
            self.ttl()
            return self.d
        if self.obs.problems:
            self.invalid()
            return self.d
        self.checkpoints()
        if self.job.spec.run_policy.suspend:
            self.suspend()
            return self.d
        if self.s.phase == JobPhase.SUSPENDED:
            self.resume()
        if self.deadline_exceeded():
            return self.d
        old = [p for p in self.obs.pods if p.generation != self.s.generation]
        if old:  # a new generation starts only once every pod of the old one is gone
            self.delete(old)
            return self.d
        current = [p for p in self.obs.pods if p.generation == self.s.generation]
        if not current and self.wait():
            return self.d
        self.gang(current)
        return self.d

    def adopt_newer_generation(self) -> None:
        """Pods newer than the status (a status lost or restored from backup) define the current generation."""
        newest = max((p.generation for p in self.obs.pods), default=self.s.generation)
        if newest > self.s.generation:
            self.s.generation = newest

    def reopen_if_spec_fixed(self) -> None:
        """A job failed as InvalidSpec is looked at again when its spec changes (a new metadata.generation)."""
        invalid = find(self.s.conditions, C.INVALID_SPEC)
        if self.s.phase != JobPhase.FAILED or invalid is None or invalid.status != "True":
            return
        if invalid.observed_generation == self.job_gen:
            return
        if self.obs.problems:
            self.invalid()
            return
        self.cond(C.INVALID_SPEC, False, "SpecFixed", "the spec was changed and passes the operator's checks")
        self.clear(C.FAILED, "SpecFixed")
        self.s.phase, self.s.completion_time = JobPhase.PENDING, None
        self.event("Normal", "SpecFixed", "the spec passes the operator's checks now; starting the job")

    def invalid(self) -> None:
        message = "; ".join(self.obs.problems)
        already = find(self.s.conditions, C.INVALID_SPEC)
        if already is not None and already.status == "True" and already.message == message:
            return  # reported once; a fixed spec (a new metadata.generation) is looked at again
        self.cond(C.INVALID_SPEC, True, "InvalidSpec", message)
        self.finish(JobPhase.FAILED, "InvalidSpec", message)

    def checkpoints(self) -> None:
        if self.obs.checkpoints is None:
            return
        shared, reason, message = self.obs.checkpoints
        was = find(self.s.conditions, C.CHECKPOINTS_SHARED)
        changed = was is None or was.status == "True" or was.message != message
        if not shared and changed and not self.obs.checkpoints_warned_at_admission:
            self.event("Warning", reason, message)
        self.cond(C.CHECKPOINTS_SHARED, shared, reason, message)

    def suspend(self) -> None:
        self.delete(self.obs.pods)
        self.s.ranks_ready = 0
        if self.s.phase != JobPhase.SUSPENDED:
            self.s.phase = JobPhase.SUSPENDED
            self.cond(C.SUSPENDED, True, "Suspended", "spec.runPolicy.suspend: pods deleted, checkpoints kept")
            self.clear(C.RUNNING, "Suspended")
            self.event("Normal", "Suspended", "job suspended: its pods are deleted, its checkpoints kept")

    def resume(self) -> None:
        self.s.generation += 1
        self.s.phase, self.s.start_time, self.s.fill_restarts = JobPhase.PENDING, None, 0
        self.cond(C.SUSPENDED, False, "Resumed", f"resumed as generation {self.s.generation}")
        self.event("Normal", "Resumed", f"job resumed: generation {self.s.generation} starts from the checkpoints")

    def deadline_exceeded(self) -> bool:
        limit_s = self.job.spec.run_policy.active_deadline_seconds
        started = _parse_time(self.s.start_time)
        if limit_s is None or started is None:
            return False
        left_s = (started - self.obs.now).total_seconds() + limit_s
        if left_s > 0:
            self.requeue(left_s)
            return False
        self.finish(JobPhase.FAILED, "DeadlineExceeded", f"the job ran longer than activeDeadlineSeconds ({limit_s} s)")
        return True

    def wait(self) -> bool:
        """With nothing created yet, a missing prerequisite makes the job wait (its watch clears it)."""
        if self.obs.waiting is None:
            self.clear(C.WAITING, "Resolved")
            return False
        reason, message = self.obs.waiting
        was = find(self.s.conditions, C.WAITING)
        if was is None or was.status != "True" or was.message != message:
            self.event("Warning", reason, message)
        self.s.phase = JobPhase.WAITING
        self.cond(C.WAITING, True, reason, message)
        self.requeue(_WAITING_RECHECK_S)
        return True

    # -- the running gang ------------------------------------------------------------------------------------------
    def failures(self, current: list[PodView]) -> list[_Failure]:
        restart_on = self.job.spec.run_policy.restart_on_exit_codes
        out = []
        for pod in sorted(current, key=lambda p: p.rank):
            where = f"rank {pod.rank} (pod {pod.name})"
            if pod.disruption is not None:
                out.append(_Failure(pod.rank, pod.name, f"{where} was disrupted: {pod.disruption}", None))
            elif pod.trainer is not None and pod.trainer.exit_code != 0:
                end = pod.trainer
                detail = end.message or end.reason or "no termination message"
                kind = classify(end.exit_code, restart_on)
                out.append(_Failure(pod.rank, pod.name, f"{where}: trainer {exit_text(end.exit_code)}: {detail}", kind))
            elif pod.failure is not None:
                out.append(_Failure(pod.rank, pod.name, f"{where} failed: {pod.failure}", ExitClass.RETRYABLE))
            elif pod.deleting:
                out.append(_Failure(pod.rank, pod.name, f"{where} was deleted by someone else", None))
        return out

    def restart(self, current: list[PodView], failure: _Failure, *, counted: bool) -> None:
        policy = self.job.spec.run_policy
        if counted and self.s.restarts >= policy.backoff_limit:
            self.finish(
                JobPhase.FAILED,
                "BackoffLimitExceeded",
                f"{failure.text}; the job restarted {self.s.restarts} times (backoffLimit {policy.backoff_limit})",
            )
            return
        if counted:
            self.s.restarts += 1
        else:
            self.s.disruptions += 1
        self.s.generation += 1
        self.s.phase, self.s.ranks_ready, self.s.fill_restarts = JobPhase.RESTARTING, 0, 0
        reason = "TrainerFailed" if counted else "Disrupted"
        counts = f"restart {self.s.restarts}/{policy.backoff_limit}" if counted else "not counted against backoffLimit"
        message = f"{failure.text}; restarting the whole job as generation {self.s.generation} from its checkpoints ({counts})"
        self.cond(C.RESTARTING, True, reason, message)
        self.clear(C.RUNNING, reason)
        self.event("Warning", reason, message)
        self.delete(current)

    def gang(self, current: list[PodView]) -> None:
        world = self.job.world_size
        self.fill_restarted(current)  # news even when the gang restarts in this same pass (it resets the count)
        failures = self.failures(current)
        permanent = [f for f in failures if f.kind == ExitClass.PERMANENT]
        if permanent:
            self.finish(JobPhase.FAILED, "TrainerFailed", permanent[0].text)
            return
        retryable = [f for f in failures if f.kind == ExitClass.RETRYABLE]
        if retryable:
            self.restart(current, retryable[0], counted=True)
            return
        present = {p.rank for p in current}
        missing = [r for r in range(world) if r not in present]
        if failures or (missing and self.s.phase == JobPhase.RUNNING):
            lost = failures[0] if failures else _Failure(missing[0], "", f"rank {missing[0]}'s pod is gone", None)
            self.restart(current, lost, counted=False)
            return
        self.fill_restarts(current)
        self.spec_change(current)
        if len(current) == world and all(p.trainer is not None and p.trainer.exit_code == 0 for p in current):
            self.finish(
                JobPhase.SUCCEEDED,
                "TrainingFinished",
                f"every rank's trainer finished (generation {self.s.generation})",
            )
            return
        if missing:
            self.d.create_ranks = missing
            self.s.start_time = self.s.start_time or self.now  # activeDeadlineSeconds counts from here
            if not current:
                message = f"generation {self.s.generation}: {world} pods created"
                self.cond(C.CREATED, True, "PodsCreated", message)
                if self.s.generation > 0:
                    # a restart's new gang is news; a new job's first one is what ``kubectl apply`` asked for, told
                    # by the Created condition now and the Running one once it runs (an Event is a request: #29)
                    self.event("Normal", "PodsCreated", message)
        self.s.ranks_ready = sum(1 for p in current if p.trainer_running)
        running = self.s.ranks_ready == world
        if running and self.s.phase != JobPhase.RUNNING:
            self.s.phase = JobPhase.RUNNING
            message = f"all {world} ranks of generation {self.s.generation} run"
            self.cond(C.RUNNING, True, "AllRanksRunning", message)
            self.clear(C.RESTARTING, "Restarted", message)
            if self.s.generation > 0:
                # like PodsCreated: a restarted gang running again is news, a new job's first one is told by the
                # Running condition (at 1 000 jobs started at once, this Event was one request in twelve: #29)
                self.event("Normal", "Running", message)
            self.deadline_exceeded()  # arms the requeue for activeDeadlineSeconds
        elif not running and self.s.phase != JobPhase.RUNNING:
            # a restarted gang is Restarting until all of its ranks run again
            restarting = is_true(self.s.conditions, C.RESTARTING)
            self.s.phase = JobPhase.RESTARTING if restarting else JobPhase.PENDING
        # containers that cannot start (an image, a container's config): StartBlocked, an Event per problem
        report = start_blocked(current, find(self.s.conditions, C.START_BLOCKED), started=running)
        self.d.events += [Event("Warning", reason, message) for reason, message in report.events]
        if report.condition is not None:
            self.cond(C.START_BLOCKED, *report.condition)

    def spec_change(self, current: list[PodView]) -> None:
        """An edit is not taken silently: SpecChangePending names what waits for the next gang (specchange.py)."""
        change = spec_change(self.job, self.obs.running_spec, current, job_generation=self.job_gen)
        was = find(self.s.conditions, C.SPEC_CHANGE_PENDING)
        if change is None:
            return
        if not change.pending:
            self.clear(C.SPEC_CHANGE_PENDING, "Applied", change.message)
            return
        if was is None or was.status != "True" or was.message != change.message:
            self.event("Normal", "SpecChangePending", change.message)  # once per edit
        self.cond(C.SPEC_CHANGE_PENDING, True, "AppliesAtNextStart", change.message)

    def fill_restarted(self, current: list[PodView]) -> None:
        total = sum(p.fill_restarts for p in current)
        if total > self.s.fill_restarts:
            grew = ", ".join(restarted_text(p) for p in current if p.fill_restarts)
            self.event(
                "Warning", "FillExecutorRestarted", f"fill-executor sidecars restarted ({grew}); training goes on"
            )
        self.s.fill_restarts = total

    def fill_restarts(self, current: list[PodView]) -> None:
        self.d.restart_fill, wait_s = fill_restarts_due(current, self.obs.now)
        if wait_s is not None:
            self.requeue(wait_s)


def decide(
    job: PipelineTrainingJob, status: PipelineTrainingJobStatus, observed: Observed, *, job_generation: int
) -> Decision:
    """The next status and the actions that lead there; ``job_generation`` is the job's ``metadata.generation``."""
    return _Step(job, status, observed, job_generation).run()
