"""The runner: wait for a bubble, pick the job and batch size for it, run steps, acknowledge; stop when the trainer
is gone. One process, one thread: the hot path is :mod:`pipefill_fill.inbubble`; this module manages jobs around it."""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from pipefill.plan import BubbleClass, JobProfile, ObservedBubble, assign_jobs, classes_from_bubbles, plan_class
from pipefill.spec import FillJobPhase
from pipefill_fill.events import EventLog
from pipefill_fill.inbubble import BubbleOutcome, run_profile_steps, run_steps
from pipefill_fill.metrics import FillMetrics
from pipefill_fill.offload import Offloader
from pipefill_fill.predict import Estimator, StepPredictor
from pipefill_fill.profiler import BubbleProfiler, Profile
from pipefill_fill.settings import Settings
from pipefill_fill.sources import ProgressReport, WorkSource
from pipefill_fill.sources.base import now_rfc3339
from pipefill_fill.task import FillTask, TaskSpec

__all__ = ["Link", "Runner"]

log = logging.getLogger("pipefill_fill")


class Link(Protocol):
    """What the runner needs of the bubble channel (pipefill_fill.attach adapts the channel's consumer to it)."""

    def wait_bubble(self, timeout_s: float) -> Any: ...

    def is_open(self, bubble_id: int) -> bool: ...

    def acknowledge(self, bubble_id: int, *, used_s: float, overrun_s: float, work: int) -> None: ...

    def trainer_alive(self) -> bool: ...

    def recent_bubbles(self) -> list[ObservedBubble]: ...


@dataclass
class _Active:
    task: FillTask
    profiler: BubbleProfiler
    offloader: Offloader | None
    predictor: StepPredictor | None = None
    commit_estimate: Estimator = field(default_factory=lambda: Estimator(default_s=0.010))
    transfer_estimate: Estimator = field(default_factory=lambda: Estimator(default_s=0.0))
    started: str = field(default_factory=now_rfc3339)
    reported_at: float = 0.0
    rate_items: float = 0.0
    rate_since: float = field(default_factory=time.monotonic)

    @property
    def profile(self) -> Profile | None:
        return self.profiler.result


class _JobError(Exception):
    def __init__(self, job: str, total: int) -> None:
        super().__init__(job)
        self.job, self.total = job, total


@contextlib.contextmanager
def _guard(name: str, a: _Active) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        raise _JobError(name, a.task.spec.total) from exc


class Runner:
    def __init__(
        self,
        *,
        link: Link,
        source: WorkSource,
        device: torch.device,
        settings: Settings,
        metrics: FillMetrics,
        events: EventLog,
        max_active: int = 2,
        poll_interval_s: float = 5.0,
        trainer_grace_s: float = 1.0,
    ) -> None:
        self.link, self.source, self.device, self.settings = link, source, device, settings
        self.metrics, self.events = metrics, events
        self.max_active, self.poll_interval_s = max_active, poll_interval_s
        self.trainer_grace_s = trainer_grace_s  # a restarted trainer re-creates the channel within this; else stop
        self.active: dict[str, _Active] = {}
        self.failed: set[str] = set()
        self.switch = Estimator(default_s=0.0005, window=64, quantile=0.9)
        self._assignment: dict[float, str] = {}
        self._bubbles_since_assign = 0
        self._next_poll = 0.0
        self._stop = ""

    # -- the loop -------------------------------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._request_stop("SIGTERM"))
        dead_since: float | None = None
        while not self._stop:
            if time.monotonic() >= self._next_poll or not self.active:
                self._refresh_jobs()
            bubble = self.link.wait_bubble(0.25 if self.active else 1.0)
            if bubble is None:
                if self.link.trainer_alive():
                    dead_since = None
                elif dead_since is None:
                    dead_since = time.monotonic()
                elif time.monotonic() - dead_since >= self.trainer_grace_s:
                    self._request_stop("trainer gone")
                continue
            dead_since = None
            self._on_bubble(bubble, woke_ns=time.monotonic_ns())
        self._shutdown()
        return 0

    def _request_stop(self, why: str) -> None:
        if not self._stop:
            self._stop = why
            log.info("stopping: %s", why)

    def _on_bubble(self, bubble: Any, *, woke_ns: int) -> None:
        switch_s = max(0, woke_ns - bubble.open_ns) / 1e9
        self.switch.record(switch_s)
        self.metrics.switch_seconds.observe(switch_s)
        deadline_ns = bubble.expected_end_ns - int(self.settings.guard_s * 1e9)
        offered_s = (bubble.expected_end_ns - bubble.open_ns) / 1e9
        try:
            job, reason, out, batch = self._fill(bubble, deadline_ns, offered_s)
        except _JobError as exc:  # the workload raised: that job fails, the executor and other jobs go on
            self._fail(exc.job, f"{type(exc.__cause__).__name__}: {exc.__cause__}", total=exc.total)
            job, reason, out, batch = exc.job, "error", BubbleOutcome(stop="error"), None
        yielded_ns = time.monotonic_ns()
        overrun_s = max(0, yielded_ns - bubble.expected_end_ns) / 1e9 if out.steps else 0.0
        used_s = (out.busy_ns + out.commit_ns + out.transfer_ns) / 1e9
        self.link.acknowledge(bubble.id, used_s=used_s, overrun_s=overrun_s, work=out.items)
        self.metrics.bubble(offered_s=offered_s, busy_s=used_s, overrun_s=overrun_s, used=out.steps > 0)
        if not out.steps:
            self.metrics.bubbles_skipped.labels(reason or out.stop or "time").inc()
        if job is not None and out.items:
            self.metrics.items.labels(job).inc(out.items)
        self.events.write(
            "bubble",
            id=bubble.id,
            kind=str(getattr(bubble, "kind", "")),
            open_ns=bubble.open_ns,
            expected_end_ns=bubble.expected_end_ns,
            woke_ns=woke_ns,
            yielded_ns=yielded_ns,
            free_bytes=getattr(bubble, "free_bytes", None),
            job=job,
            batch_size=batch,
            steps=out.steps,
            items=out.items,
            used_s=round(used_s, 9),
            overrun_s=round(overrun_s, 9),
            commit_s=round(out.commit_ns / 1e9, 9),
            stop=out.stop or reason,
            spans_ns=out.spans_ns,
        )
        if job is not None and out.commit_ns and job in self.active:
            self._after_commit(self.active[job], out)
        if job is not None and job in self.active and self.active[job].task.done():
            self._complete(job)
        self._bubbles_since_assign += 1

    def _fill(
        self, bubble: Any, deadline_ns: int, offered_s: float
    ) -> tuple[str | None, str, BubbleOutcome, int | None]:
        if offered_s < self.settings.min_bubble_s:
            return None, "short", BubbleOutcome(), None
        if not self.active:
            return None, "idle", BubbleOutcome(), None
        is_open = self.link.is_open
        for name, a in self.active.items():  # profiling comes first: it is short and everything waits on it
            if a.profile is None:
                with _guard(name, a):
                    out = run_profile_steps(bubble, profiler=a.profiler, is_open=is_open, deadline_ns=deadline_ns)
                if a.profile is not None:
                    self._profiled(name, a)
                return name, "profiling", out, None
        name = self._job_for(bubble)
        if name is None:
            return None, "memory", BubbleOutcome(), None
        a = self.active[name]
        free = min(
            int(getattr(bubble, "free_bytes", 0) or 0) or self.settings.reserved_bytes, self.settings.reserved_bytes
        )
        now = time.monotonic_ns()
        plan = plan_class(
            BubbleClass((deadline_ns - now) / 1e9, free),
            a.profile.points if a.profile else (),
            guard_s=0.0,
            transfer_s=2 * a.transfer_estimate.predict_s() if a.offloader else 0.0,
            margin_bytes=self.settings.margin_bytes if self.device.type == "cuda" else 0,
        )
        if plan.batch_size is None:
            return name, "memory" if plan.reason.startswith("memory") else "time", BubbleOutcome(), None
        assert a.predictor is not None  # set when the profile completed
        with _guard(name, a):
            out = run_steps(
                bubble,
                task=a.task,
                batch_sizes=[
                    plan.batch_size,
                    *sorted((p.batch_size for p in a.profile.points if p.batch_size < plan.batch_size), reverse=True),
                ]
                if a.profile
                else [plan.batch_size],
                predictor=a.predictor,
                commit_estimate=a.commit_estimate,
                is_open=is_open,
                deadline_ns=deadline_ns,
                device=self.device,
                offloader=a.offloader if self.settings.offload else None,
                transfer_estimate=a.transfer_estimate,
            )
        return name, "", out, plan.batch_size

    # -- jobs -----------------------------------------------------------------------------------------------------
    def _job_for(self, bubble: Any) -> str | None:
        """The job whose class this bubble belongs to (assignment recomputed every 64 bubbles)."""
        ready = {n: a for n, a in self.active.items() if a.profile and a.profile.points}
        if not ready:
            return None
        if len(ready) == 1:
            return next(iter(ready))
        if not self._assignment or self._bubbles_since_assign >= 64:
            self._reassign(ready)
        duration_s = (bubble.expected_end_ns - bubble.open_ns) / 1e9
        nearest = min(self._assignment, key=lambda d: abs(d - duration_s), default=None)
        name = self._assignment.get(nearest) if nearest is not None else None
        return name if name in ready else next(iter(ready))

    def _reassign(self, ready: dict[str, _Active]) -> None:
        classes = classes_from_bubbles(self.link.recent_bubbles(), default_free_bytes=self.settings.reserved_bytes)
        jobs = [
            JobProfile(n, a.profile.points, a.task.spec.priority, a.task.spec.kind)
            for n, a in ready.items()
            if a.profile
        ]
        assignment = assign_jobs(classes, jobs, guard_s=self.settings.guard_s, switch_s=self.switch.predict_s())
        self._assignment = {a.bubble.duration_s: a.job for a in assignment if a.job is not None}
        self._bubbles_since_assign = 0
        self.events.write(
            "assign", classes={f"{a.bubble.duration_s * 1e3:.3f}ms": a.job for a in assignment}, jobs=list(ready)
        )

    def _refresh_jobs(self) -> None:
        self._next_poll = time.monotonic() + self.poll_interval_s
        if len(self.active) >= self.max_active:
            return
        for spec in self.source.poll():
            if spec.name in self.active or spec.name in self.failed or len(self.active) >= self.max_active:
                continue
            if self.source.acquire(spec.name):
                self._open(spec)

    def _open(self, spec: TaskSpec) -> None:
        try:
            task = FillTask(spec)
            recovered = task.open(device=self.device, memory_budget_bytes=self.settings.reserved_bytes)
        except Exception as exc:  # a job that cannot start fails alone; the executor and the other jobs go on
            self._fail(spec.name, f"cannot start: {exc}", total=spec.total)
            return
        if recovered.done:
            self.source.report(spec.name, ProgressReport(FillJobPhase.SUCCEEDED, recovered.end, spec.total))
            self.source.release(spec.name)
            return
        modules = getattr(task.workload, "modules", lambda: [])()
        offloader = Offloader(list(modules), self.device) if self.settings.offload else None
        profiler = BubbleProfiler(task, self.device, memory_budget_bytes=self.settings.reserved_bytes)
        a = _Active(task, profiler, offloader)
        self.active[spec.name] = a
        if a.profile is not None:
            self._profiled(spec.name, a)
        self.events.write("job", job=spec.name, phase="Running", committed=recovered.end, total=spec.total)
        self.source.report(
            spec.name, ProgressReport(FillJobPhase.RUNNING, recovered.end, spec.total, start_time=a.started)
        )
        self._assignment = {}

    def _profiled(self, name: str, a: _Active) -> None:
        assert a.profile is not None
        points = a.profile.points
        a.predictor = StepPredictor({p.batch_size: p.step_s for p in points})
        self.metrics.profile(name, [(p.batch_size, p.step_s, p.peak_bytes) for p in points])
        self.events.write(
            "profile",
            job=name,
            cached=a.profile.cached,
            device=a.profile.device_key,
            points=[{"batch_size": p.batch_size, "step_s": p.step_s, "peak_bytes": p.peak_bytes} for p in points],
        )
        log.info("job %s: profile %s", name, ", ".join(f"{p.batch_size}:{p.step_s * 1e3:.2f}ms" for p in points))
        if not points:  # not a failure of the job: another rank (longer bubbles, more memory) may run it
            message = "no batch size fits this rank's bubbles and memory budget; left for another executor"
            log.warning("job %s: %s", name, message)
            self.active.pop(name, None)
            self.failed.add(name)
            self.events.write("job", job=name, phase="Queued", message=message)
            self.source.report(
                name, ProgressReport(FillJobPhase.QUEUED, a.task.committed, a.task.spec.total, message=message)
            )
            self.source.release(name)
            return
        if a.offloader is not None:
            a.offloader.to_host()

    def _after_commit(self, a: _Active, out: BubbleOutcome) -> None:
        name = a.task.spec.name
        self.metrics.commits.labels(name).inc()
        self.metrics.committed_items.labels(name).set(a.task.committed)
        self.events.write(
            "commit", job=name, end=a.task.committed, bytes=out.committed_bytes, commit_s=out.commit_ns / 1e9
        )
        now = time.monotonic()
        if now - a.reported_at >= 2.0:
            rate = (a.task.committed - a.rate_items) / max(1e-9, now - a.rate_since) if a.reported_at else None
            a.reported_at, a.rate_items, a.rate_since = now, a.task.committed, now
            self.source.report(
                name,
                ProgressReport(FillJobPhase.RUNNING, a.task.committed, a.task.spec.total, rate, start_time=a.started),
            )

    def _complete(self, name: str) -> None:
        a = self.active.pop(name)
        try:
            if a.offloader is not None:
                a.offloader.to_device()
            a.task.finish()
        except Exception as exc:
            self._fail(name, f"finishing failed: {exc}", total=a.task.spec.total)
            return
        self.events.write("job", job=name, phase="Succeeded", committed=a.task.committed, total=a.task.spec.total)
        log.info("job %s: succeeded (%d/%d)", name, a.task.committed, a.task.spec.total)
        report = ProgressReport(
            FillJobPhase.SUCCEEDED,
            a.task.committed,
            a.task.spec.total,
            start_time=a.started,
            completion_time=now_rfc3339(),
        )
        self.source.report(name, report)
        self.source.release(name)
        self._assignment = {}
        self._next_poll = 0.0

    def _fail(self, name: str, message: str, *, total: int) -> None:
        log.error("job %s: failed: %s", name, message)
        self.failed.add(name)
        self.events.write("job", job=name, phase="Failed", message=message)
        committed = self.active[name].task.committed if name in self.active else 0
        self.source.report(name, ProgressReport(FillJobPhase.FAILED, committed, total, message=message))
        self.active.pop(name, None)
        self.source.release(name)

    def _shutdown(self) -> None:
        """Commit what is done, so a restart or another rank continues from there; then give the jobs back."""
        for name, a in list(self.active.items()):
            try:
                if a.task.progress > a.task.committed and a.profile is not None:
                    if a.offloader is not None:
                        a.offloader.to_device()
                    a.task.commit()
                self.source.report(
                    name,
                    ProgressReport(FillJobPhase.RUNNING, a.task.committed, a.task.spec.total, start_time=a.started),
                )
            finally:
                self.source.release(name)
            self.events.write("commit", job=name, end=a.task.committed, bytes=0, commit_s=0.0, at="shutdown")
        self.events.write("exit", reason=self._stop)
        self.source.close()
