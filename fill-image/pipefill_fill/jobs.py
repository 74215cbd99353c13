"""The jobs an executor works on, one slice of each at a time: claiming slices from the work source, opening and
profiling them, committing, moving on to the next slice, completing, failing, releasing, with the status reports
and events of each step. The runner (:mod:`pipefill_fill.runner`) calls it between bubbles."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Unpack

import torch

from pipefill.env import fill_max_active_jobs
from pipefill.events import EventWriter, JobEvent, ProfileEvent, SliceEvent
from pipefill.plan import ObservedBubble
from pipefill.spec import FillJobPhase
from pipefill.spec.fillstatus import RankBubbles, UnfitReport
from pipefill_fill.active import COMMIT_DEFAULT_S, ActiveJob, tail_sizes
from pipefill_fill.claim import RECOVERY_LOCK_TIMEOUT_S, built_key, claim_slice
from pipefill_fill.commits import CommitWriter, Pending
from pipefill_fill.device import step_clock
from pipefill_fill.inbubble import BubbleOutcome
from pipefill_fill.locks import LockBusy
from pipefill_fill.metrics import FillMetrics
from pipefill_fill.offload import Offloader
from pipefill_fill.predict import Estimator, StepModel
from pipefill_fill.profilecache import load_cached
from pipefill_fill.profiler import BubbleProfiler
from pipefill_fill.reporting import ReportFields, commit_event, progress_report, released, written_event
from pipefill_fill.settings import Settings
from pipefill_fill.slices import JobDir
from pipefill_fill.sources import Identity, ProgressReport, WorkSource
from pipefill_fill.sources.base import now_rfc3339
from pipefill_fill.store import Superseded
from pipefill_fill.task import FillTask, TaskSpec
from pipefill_fill.unfit import bubble_classes, unfit_report
from pipefill_fill.warmup import start_slice, warm

__all__ = ["ActiveJob", "Jobs"]

log = logging.getLogger("pipefill_fill")

_REPORT_EVERY_S = 2.0
_WRITER_CLOSE_S = 30.0
LOCK_RETRY_S = 30.0
"""After a slice's commit lock was found held past the time limit (a previous owner hanging inside a commit), its job
is not tried again for this long: each try waits out the limit, which the other jobs' bubbles would pay."""


class Jobs:
    """The active jobs (name → :class:`ActiveJob`), at most ``max_active``; ``generation`` grows when the set changes."""

    def __init__(
        self,
        *,
        source: WorkSource,
        device: torch.device,
        settings: Settings,
        metrics: FillMetrics,
        events: EventWriter,
        max_active: int | None = None,  # None: PIPEFILL_FILL_MAX_ACTIVE_JOBS
        recent_bubbles: Callable[[], list[ObservedBubble]] = list,
        identity: Identity | None = None,
        lock_timeout_s: float = RECOVERY_LOCK_TIMEOUT_S,
        lock_retry_s: float = LOCK_RETRY_S,
        writer: CommitWriter | None = None,  # None: one of its own
    ) -> None:
        self.source, self.device, self.settings, self.metrics, self.events = source, device, settings, metrics, events
        self.lock_timeout_s, self.lock_retry_s = lock_timeout_s, lock_retry_s  # opening a slice another process locks
        self.recent_bubbles = recent_bubbles  # the bubbles this rank saw lately: its classes, and the unfit check
        self.identity = identity or getattr(source, "identity", None) or Identity("", 0)
        self.max_active = fill_max_active_jobs() if max_active is None else max_active
        self.active: dict[str, ActiveJob] = {}
        self.releasing: list[ActiveJob] = []  # let go of, a commit in flight: logged once it is written
        self.failed: set[str] = set()
        self.busy_until: dict[str, float] = {}  # job -> when to try again to open a slice another process held locked
        self.generation = 0
        self.step_clock = step_clock(device, idle=settings.cpu_idle)  # what a fill step costs (profile, model)
        self.writer = writer or CommitWriter()  # the file part of every commit, off the filling thread
        self.built: dict[str, object] = {}  # workload and device -> its last instance (claim_slice, reuse)
        self.warm: defaultdict[str, dict[int, float | None]] = defaultdict(dict)  # workload, device -> size called -> s
        self.models: dict[str, StepModel] = {}  # workload and device -> the step model of its last job here
        # workload and device -> what its commits cost here, shared by its jobs (ActiveJob.commit_estimate)
        self.commit_estimates: defaultdict[str, Estimator] = defaultdict(lambda: Estimator(default_s=COMMIT_DEFAULT_S))

    # -- taking work ----------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Poll the source: let go of active jobs it no longer offers (finished, failed, cancelled, suspended or moved
        elsewhere: nothing more is committed, what was committed stays) and claim a slice of new ones while there is
        room."""
        specs = self.source.poll()
        self.metrics.prune()  # series of jobs let go of long enough ago
        offered = {s.name for s in specs}
        for name in [n for n in self.active if n not in offered]:
            self.let_go(name, "no longer assigned here (finished, failed, cancelled, suspended or moved)")
        for spec in specs:
            if not self.room():
                break
            if spec.name not in self.active and spec.name not in self.failed and not self._waiting(spec.name):
                self._start(spec)

    def finishing(self) -> int:
        """Active jobs whose slice is all stepped: only its last commit is left (written off the filling thread)."""
        return sum(1 for a in self.active.values() if a.profile is not None and a.task.done())

    def room(self) -> bool:
        """Whether another job may start: fewer than ``max_active`` with work left to step, one more at most (the next
        is prepared — claimed, set up, warm — while a finishing job's last commit is written: no switch waits on it)."""
        working = len(self.active) - self.finishing()
        return working < self.max_active and len(self.active) < self.max_active + 1

    def _waiting(self, name: str) -> bool:
        """Whether ``name`` found its slice locked less than ``lock_retry_s`` ago (see :data:`LOCK_RETRY_S`), or is
        offered again before the commit it had in flight here when it was let go of is settled."""
        if (until := self.busy_until.get(name)) is not None and time.monotonic() >= until:
            del self.busy_until[name]  # the wait is over
        return name in self.busy_until or any(a.name == name for a in self.releasing)

    def _start(self, spec: TaskSpec) -> None:
        job = JobDir(spec)
        t0 = time.monotonic_ns()
        try:
            task = None if job.done() else self._claim(spec, job)
        except LockBusy as exc:  # a previous owner of its slice hangs inside a commit: this job waits, others go on
            log.warning("job %s: a slice not opened, tried again in %.0f s: %s", spec.name, self.lock_retry_s, exc)
            self.busy_until[spec.name] = time.monotonic() + self.lock_retry_s
            self._report(spec, job, FillJobPhase.RUNNING, message=f"{self.who()}: {exc}")
            return
        except Exception as exc:  # a job that cannot start fails alone; the executor and the other jobs go on
            self.fail(spec.name, f"cannot start: {exc}", spec=spec)
            return
        if task is None:
            if job.done():  # completed now, or before with the report lost with its executor
                self._succeeded(spec, job, started=None)
            return
        key = built_key(task, self.device)
        a = ActiveJob(
            spec, job, task, *self._tools(task), seed=self.models.get(key), commit_estimate=self.commit_estimates[key]
        )
        self.active[spec.name] = a
        self.metrics.job_started(spec.name, total=spec.total, committed=job.committed())
        self.generation += 1
        if not self._warm_up(a, t0):
            return
        if a.profile is not None:
            self.profiled(a)
        self.events.write(JobEvent(job=spec.name, phase="Running", committed=job.committed(), total=spec.total))
        self._report(spec, job, FillJobPhase.RUNNING, start_time=a.started)

    def _warm_up(self, a: ActiveJob, started_ns: int) -> bool:
        """A slice just opened: its first calls between bubbles (:func:`warmup.start_slice`); False: the job failed."""
        try:
            start_slice(a, started_ns, self.warm[self._key(a)], self.device, self.events)
        except Exception as exc:
            self.fail(a.name, f"starting slice {a.slice} failed: {type(exc).__name__}: {exc}")
            return False
        return True

    def _key(self, a: ActiveJob) -> str:
        return built_key(a.task, self.device)  # its workload on this device: what its jobs here share

    def _tools(self, task: FillTask) -> tuple[BubbleProfiler, Offloader | None]:
        """The profiler (the profile cached for its workload, when there is one) and offloader of a slice."""
        budget, modules = self.settings.reserved_bytes, list(getattr(task.workload, "modules", lambda: [])())
        profiler = BubbleProfiler(task, self.device, memory_budget_bytes=budget, clock=self.step_clock)
        return profiler, Offloader(modules, self.device) if self.settings.offload else None

    # -- progress -------------------------------------------------------------------------------------------------
    def profiled(self, a: ActiveJob) -> None:
        """The job's profile is complete: predict steps from it, or give the job up when no batch size fits."""
        if a.profile is None or a.profile_taken:
            return
        a.profile_taken = True
        a.profiler.store()  # completed in a bubble: its cache file is written now, between bubbles
        points = a.profile.points
        a.model = a.step_model({p.batch_size: p.step_s for p in points}) if points else None
        if a.model is not None:
            self.models[self._key(a)] = a.model  # the next job of its workload starts from it
        if a.model is not None and (tail := [b for b in tail_sizes(a) if not a.task.saw(b)]):
            try:  # between bubbles: the first calls of the sizes its bubbles' tails will run (the profile times them)
                warm(self.warm[self._key(a)], a, tail, self.device, instance=False, timed=False)
            except Exception as exc:
                self.fail(a.name, f"warming up batch sizes {tail[0]}..{tail[-1]} failed: {type(exc).__name__}: {exc}")
                return
        self.metrics.profile(a.name, [(p.batch_size, p.step_s, p.peak_bytes) for p in points])
        rows = [{"batch_size": p.batch_size, "step_s": p.step_s, "peak_bytes": p.peak_bytes} for p in points]
        self.events.write(ProfileEvent(job=a.name, cached=a.profile.cached, device=a.profile.device_key, points=rows))
        log.info("job %s: profile %s", a.name, ", ".join(f"{p.batch_size}:{p.step_s * 1e3:.2f}ms" for p in points))
        measured = a.measured
        bubbles, free, guard = self.recent_bubbles(), self.settings.reserved_bytes, self.settings.guard_s
        unfit = unfit_report(a.profiler, points, bubbles, identity=self.identity, free_bytes=free, guard_s=guard)
        if unfit is not None:
            self._unfit(a, unfit)
            return
        if measured:
            report = progress_report(a.spec, a.job, FillJobPhase.RUNNING, start_time=a.started)
            self.source.report(a.name, dataclasses.replace(report, profile=measured, bubbles=self.bubble_report()))
        if a.offloader is not None:
            a.offloader.to_host()
        self._share_profile(a)

    def _share_profile(self, a: ActiveJob) -> None:
        """Other active jobs of ``a``'s workload that waited for a profile (the dispatcher profiles one job at a time)
        take the one just cached instead of measuring it again."""
        for b in list(self.active.values()):
            if b is a or b.profile is not None or self._key(b) != self._key(a):
                continue
            cached = load_cached(b.task, self.device, memory_budget_bytes=self.settings.reserved_bytes)
            if cached is not None:
                b.profiler.adopt(cached)
                self.profiled(b)

    def _unfit(self, a: ActiveJob, unfit: UnfitReport) -> None:
        """``a`` fits none of this rank's bubbles: not a failure, another rank (longer bubbles, more memory) may run it."""
        log.warning("job %s: %s; left for another executor", a.name, unfit.message)
        self._remove(a.name)
        self.failed.add(a.name)
        self.events.write(JobEvent(job=a.name, phase="Queued", message=unfit.message))
        self.source.release(a.name)
        report = progress_report(a.spec, a.job, FillJobPhase.QUEUED, message=unfit.message)
        self.source.report(a.name, dataclasses.replace(report, unfit=unfit, profile=a.measured))

    def after_bubble(self, name: str, out: BubbleOutcome) -> None:
        """After a bubble of job ``name``: account for commits written since, move on when its slice is durable; a job
        starved of bubbles it fits (:meth:`ActiveJob.starving`) is left for another executor."""
        a = self.active.get(name)
        if a is not None and a.profile is not None and not a.profile_taken:
            self.profiled(a)  # its last measurement was in this bubble: reports and files, after the bubble
            a = self.active.get(name)  # gone when it fits none of this rank's bubbles
        elif a is not None and (unfit := a.starving(out, self.recent_bubbles, self.identity, self.settings)):
            return self._unfit(a, unfit)
        if a is not None:
            self._settle(a)

    def settle(self) -> None:
        """Between bubbles: account for the commits the writer finished, move on from slices whose work is all
        written; a commit refused (the slice moved) or failed (the storage) stops its job."""
        self._let_go_settled()
        for a in list(self.active.values()):
            self._settle(a)

    def _settle(self, a: ActiveJob) -> None:
        try:
            pending = a.task.settle()
        except Superseded as exc:
            self.superseded(a.name, exc)
            return
        except Exception as exc:
            self.fail(a.name, f"writing a commit of slice {a.slice} failed: {exc}")
            return
        if pending is not None:
            self._committed(a, pending)
        if a.task.done() and a.task.durable:
            self._slice_done(a)

    def _committed(self, a: ActiveJob, pending: Pending) -> None:
        self.events.write(event := written_event(a, pending))
        committed = event.end
        self.metrics.commits.labels(a.name).inc()
        self.metrics.committed_items.labels(a.name).set(committed)
        now = time.monotonic()
        if now - a.reported_at >= _REPORT_EVERY_S and not a.task.done():  # a finished slice reports once complete
            rate = (committed - a.rate_units) / max(1e-9, now - a.rate_since) if a.reported_at else None
            a.reported_at, a.rate_units, a.rate_since = now, committed, now
            self._report(a.spec, a.job, FillJobPhase.RUNNING, committed=committed, rate=rate, start_time=a.started)

    def _slice_done(self, a: ActiveJob) -> None:
        try:
            if a.offloader is not None:
                a.offloader.to_device()
            complete = a.task.finish()
        except Superseded as exc:
            self.superseded(a.name, exc)
            return
        except Exception as exc:
            self.fail(a.name, f"finishing slice {a.slice} failed: {exc}")
            return
        s = a.slice
        self.source.release(a.name, s)
        self.events.write(SliceEvent(job=a.name, start=s.start, end=s.end, phase="done", position=a.task.committed))
        log.info("job %s: slice %s done", a.name, s)
        t0 = time.monotonic_ns()
        try:
            task = None if complete else self._claim(a.spec, a.job)
        except Exception as exc:
            self.fail(a.name, f"cannot start the next slice: {exc}")
            return
        if task is not None:  # the next slice: same workload and device, so the profile and estimates carry over
            a.task, last, (a.profiler, a.offloader) = task, a.profiler, self._tools(task)
            a.profile_taken = not a.profiler.carry_on(last) and a.profile_taken
            if not self._warm_up(a, t0):
                return
            if a.profile is not None and a.offloader is not None:
                a.offloader.to_host()
            self._report(a.spec, a.job, FillJobPhase.RUNNING, start_time=a.started)  # its assignment moved
            return
        self._remove(a.name)
        if a.job.done():
            self._succeeded(a.spec, a.job, started=a.started)
        else:  # other executors hold the remaining slices
            self.source.release(a.name)
            self._report(a.spec, a.job, FillJobPhase.RUNNING, start_time=a.started)

    def _succeeded(self, spec: TaskSpec, job: JobDir, *, started: str | None) -> None:
        self.source.release(spec.name)
        self.events.write(JobEvent(job=spec.name, phase="Succeeded", committed=spec.total, total=spec.total))
        log.info("job %s: succeeded (%d/%d)", spec.name, spec.total, spec.total)
        self._report(spec, job, FillJobPhase.SUCCEEDED, start_time=started, completion_time=now_rfc3339())

    # -- stopping -------------------------------------------------------------------------------------------------
    def fail(self, name: str, message: str, *, spec: TaskSpec | None = None) -> None:
        """The job's workload raised (or it cannot start): the job is Failed for every executor."""
        log.error("job %s: failed: %s", name, message)
        self.metrics.job_failures.labels(name).inc()
        a = self._remove(name)
        spec = spec or (a.spec if a is not None else None)
        self.failed.add(name)
        self.events.write(JobEvent(job=name, phase="Failed", message=message))
        self.source.release(name)
        if spec is not None:
            committed = a.job.committed() if a is not None else 0
            self.source.report(name, ProgressReport(FillJobPhase.FAILED, committed, spec.total, message=message))

    def superseded(self, name: str, exc: Superseded) -> None:
        """A commit was refused: the slice moved (a newer epoch owns it) or the assignment is gone. Nothing was
        written; drop the slice's uncommitted work, say so, and take what the source offers next."""
        a = self._remove(name)
        log.warning("job %s: stale executor refused at commit: %s", name, exc)
        self.source.release(name)
        if a is not None:
            s = a.slice
            self.events.write(
                SliceEvent(job=name, start=s.start, end=s.end, phase="superseded", position=a.task.committed)
            )
            self._report(a.spec, a.job, FillJobPhase.RUNNING, message=f"{self.who()}: {exc}")

    def let_go(self, name: str, why: str) -> None:
        """Stop job ``name`` now without committing more (its assignment here ended); its committed work stays."""
        if (a := self._remove(name)) is not None:
            log.info("job %s: %s; letting go of slice %s at %d", name, why, a.slice, a.task.committed)
            self.releasing.append(a)  # its commit in flight lands first (or is refused): the slice is held till then
            self._let_go_settled()

    def _let_go_settled(self) -> None:
        """Jobs let go of whose commit in flight is settled: logged (:func:`released`), given back to the source."""
        for a in [a for a in self.releasing if released(a, self.events)]:
            self.releasing.remove(a)
            self.source.release(a.name)

    def who(self) -> str:
        return f"executor of {self.identity.training_job} rank {self.identity.rank}"

    def bubble_report(self) -> RankBubbles | None:
        """This rank's bubble classes as measured (None before any bubble closed)."""
        return bubble_classes(self.recent_bubbles(), identity=self.identity, free_bytes=self.settings.reserved_bytes)

    def shutdown(self) -> None:
        """Commit what is done, so a restart or another rank continues from there; then give the jobs back."""
        for a in list(self.active.values()):
            self._stop_job(a)
        if not self.writer.close(timeout_s=_WRITER_CLOSE_S):  # commits of jobs let go; the storage does not answer
            log.warning("commits still being written after %.0f s at shutdown; not waiting longer", _WRITER_CLOSE_S)
        self._let_go_settled()

    def _stop_job(self, a: ActiveJob) -> None:
        self._remove(a.name)
        try:
            a.commit_rest()
        except Superseded as exc:
            log.warning("job %s: at shutdown: %s", a.name, exc)
            return
        finally:
            self.source.release(a.name)
        committed = a.job.committed()
        self.events.write(commit_event(a, committed, written=0, commit_s=0.0, at="shutdown"))
        self._report(a.spec, a.job, FillJobPhase.RUNNING, committed=committed, start_time=a.started)

    def _claim(self, spec: TaskSpec, job: JobDir) -> FillTask | None:
        task = claim_slice(
            self.source, spec, job, device=self.device, memory_budget_bytes=self.settings.reserved_bytes,
            events=self.events, lock_timeout_s=self.lock_timeout_s,
            built=None if self.settings.offload else self.built,  # offload moves a job's modules: not shared
        )  # fmt: skip
        if task is not None:
            task.writer = self.writer
        return task

    def _remove(self, name: str) -> ActiveJob | None:
        a = self.active.pop(name, None)
        if a is not None:
            a.profiler.store_unfinished()  # sizes measured so far serve the next job of its workload
            self.generation += 1
            self.metrics.retire(name)
        return a

    def _report(self, spec: TaskSpec, job: JobDir, phase: FillJobPhase, **fields: Unpack[ReportFields]) -> None:
        self.source.report(spec.name, progress_report(spec, job, phase, **fields))
