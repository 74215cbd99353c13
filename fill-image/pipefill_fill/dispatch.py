"""Per bubble: which active job gets it and at which batch size, then its steps (:mod:`pipefill_fill.inbubble`).

Profiling comes first (it is short and bounded), and the rest of its bubble goes to work that fits: the job's steps
at the batch sizes measured so far, or — nothing measured yet — another job (the runner hands it on). Then a slice whose work is done and whose last commit
is still to be made (its device part needs a bubble). With several profiled jobs, each bubble goes to the job
:func:`pipefill.plan.assign_jobs` gave the class nearest its length, recomputed from the channel's ring of
measured bubbles every 64 bubbles and whenever the active jobs change.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pipefill.events import AssignEvent, EventWriter, MeasureEvent
from pipefill.plan import JobProfile, ObservedBubble, assign_jobs, classes_from_bubbles
from pipefill_fill.active import ActiveJob
from pipefill_fill.claim import built_key
from pipefill_fill.inbubble import BubbleOutcome, commit_between, defer_commit, fits, run_steps
from pipefill_fill.inpieces import PieceCosts
from pipefill_fill.inprofile import due_between, run_profile_steps
from pipefill_fill.jobs import Jobs
from pipefill_fill.predict import Estimator, StepModel
from pipefill_fill.settings import Settings
from pipefill_fill.store import Superseded

__all__ = ["Dispatcher", "JobError"]

log = logging.getLogger("pipefill_fill")

_REASSIGN_EVERY = 64


class JobError(Exception):
    """A job's workload raised inside a bubble (the cause is chained): that job fails, the executor goes on."""

    def __init__(self, job: str) -> None:
        super().__init__(job)
        self.job = job

    @property
    def reason(self) -> str:
        """What the workload raised, as the job's failure says it."""
        return f"{type(self.__cause__).__name__}: {self.__cause__}"


@contextlib.contextmanager
def _guard(name: str) -> Iterator[None]:
    try:
        yield
    except Superseded:
        raise  # not the workload's fault: the slice moved; the runner stops it without failing the job
    except Exception as exc:
        raise JobError(name) from exc


class Dispatcher:
    def __init__(
        self,
        *,
        jobs: Jobs,
        is_open: Callable[[int], bool],
        recent_bubbles: Callable[[], list[ObservedBubble]],
        device: torch.device,
        settings: Settings,
        switch: Estimator,
        events: EventWriter,
    ) -> None:
        self.jobs, self.is_open, self.recent_bubbles = jobs, is_open, recent_bubbles
        self.device, self.settings, self.switch, self.events = device, settings, switch, events
        self._assignment: dict[float, str] = {}
        self._generation = -1
        self._bubbles_since_assign = 0

    def fill(
        self, bubble: Any, deadline_ns: int, offered_s: float, *, exclude: str | None = None
    ) -> tuple[str | None, str, BubbleOutcome, int | None]:
        """Use ``bubble`` until ``deadline_ns``: returns (job, why nothing was run or "", outcome, batch size).
        ``exclude``: a job not to give it to (the one whose slice ran out of work earlier in the bubble)."""
        if exclude is None:
            self._bubbles_since_assign += 1
        active = {n: a for n, a in self.jobs.active.items() if n != exclude}
        if offered_s < self.settings.min_bubble_s:
            return None, "short", BubbleOutcome(), None
        if not active:
            return None, "idle", BubbleOutcome(), None
        for name, a in self._measuring(exclude).items():  # profiling first: short and bounded (PROFILE_MISSES)
            with _guard(name):
                out = run_profile_steps(bubble, profiler=a.profiler, is_open=self.is_open, deadline_ns=deadline_ns)
            if out.stop != "time" or a.profile is not None:
                return name, "profiling", out, None  # a complete profile is taken in after the bubble
            # the next measurement does not fit the time left: work that fits, with the sizes measured so far
            early = a.early_model()
            if early is None or a.profiler.mid_step:  # nothing measured yet, or a step measured in pieces goes on
                out.stop = "profiling"  # in the next bubble: the runner hands the rest of this one to another job
                return name, "profiling", out, None
            a.profiler.pause()
            why, rest, batch = self._steps(name, a, bubble, deadline_ns, offered_s, early, any_size=False, pieces=None)
            out.extend(rest)
            return name, why, out, batch
        # a slice whose work is done waits only for its last commit: it goes first, whatever the classes say, where
        # the commit fits the time left; one that does not waits (counted towards its commit between bubbles) and
        # holds up neither the others' last commits nor the jobs with work (a commit estimate one slow commit had
        # raised above the bubbles kept three finished jobs and their queue slots for 0.6 s in bench fill-queue)
        finishing = []
        for n, a in active.items():
            if a.profile and a.task.done() and a.task.commit_due():
                if fits(time.monotonic_ns, a.commit_estimate.predict_s(), deadline_ns):
                    finishing.append(n)
                elif exclude is None:
                    defer_commit(a.task)
        chosen = finishing[0] if finishing else self._job_for(bubble, exclude)
        if chosen is None:
            return None, "memory", BubbleOutcome(), None
        a = active[chosen]
        if a.model is None:
            return chosen, "memory", BubbleOutcome(), None
        if chosen not in finishing and a.task.done():  # no job has work: nothing to run (its commit deferred above)
            return chosen, "", BubbleOutcome(stop="done"), None
        why, out, batch = self._steps(
            chosen, a, bubble, deadline_ns, offered_s, a.model, any_size=a.any_batch_size, pieces=a.piece_costs()
        )
        return chosen, why, out, batch

    def commit_between(self) -> None:
        """Between bubbles: the device part of each job's due commit that fit no bubble's start for long enough
        (:func:`pipefill_fill.inbubble.commit_between`). Raises :class:`JobError` where the workload raised."""
        for name, a in list(self.jobs.active.items()):
            with _guard(name):
                commit_between(a.task, a.commit_estimate, cost_clock=self.jobs.step_clock)

    def measure_between(self) -> list[str]:
        """Between bubbles: one measurement of each profile whose next one no bubble takes (:func:`due_between`: the
        first size, nothing measured yet, fitting none of the last bubbles), at the executor's priority, as the warm-up
        runs; a ``measure`` record each, the work it did counted. Returns the jobs whose profile is complete now (the
        runner takes them in). Raises :class:`JobError` where the workload raised."""
        complete: list[str] = []
        if not any(due_between(a.profiler) for a in self.jobs.active.values()):
            return complete  # the usual case, every loop: no workload key computed
        for name, a in self._measuring(None).items():
            if not due_between(a.profiler):
                continue
            batch_size, start = a.profiler.batch_size, time.monotonic_ns()
            with _guard(name):
                step_s = a.profiler.measure_one()
            self.events.write(
                MeasureEvent(
                    job=name,
                    batch_size=batch_size,
                    start_ns=start,
                    end_ns=time.monotonic_ns(),
                    step_s=round(step_s, 9),
                    items=a.profiler.last_items,
                )
            )
            # done work, as a bubble's steps are (an inference job's measurements are its work)
            if a.profiler.last_items:
                self.jobs.metrics.items.labels(name).inc(a.profiler.last_items)
            if a.profile is not None:
                complete.append(name)
        return complete

    def _measuring(self, exclude: str | None) -> dict[str, ActiveJob]:
        """The jobs whose profiles are measured in bubbles now: one per workload, the first active one of it without a
        profile. Another job of its workload (two started together) waits for the profile it caches
        (``Jobs._share_profile``), even while the one measuring is excluded from the rest of a bubble (its next
        measurement did not fit): measuring the same points twice would spend bubbles on work nobody keeps."""
        seen: set[str] = set()
        measuring = {}
        for name, a in self.jobs.active.items():
            # a profile completed in this bubble is taken in after it (and cached then): its job still measures it
            if a.profile_taken or (key := built_key(a.task, self.device)) in seen:
                continue
            seen.add(key)
            if a.profile is None and name != exclude:
                measuring[name] = a
        return measuring

    def floor_s(self) -> float:
        """The shortest bubble the active jobs can use now (published on the channel for the trainer's announcement
        floor): the wake-up (the 90th percentile of the last ones), the guard, and the smallest unit of work of any
        job — its smallest piece where its steps come in pieces, else its smallest whole step — at the step times
        measured since its profile. 0.0 (no estimate) with no job, or while a job is being profiled: the trainer
        then keeps its default floor."""
        units = []
        for a in self.jobs.active.values():
            if a.profile is None or a.model is None:
                return 0.0
            model, costs = a.model, a.piece_costs()
            if costs:
                first = costs.points[0]
                unit_s = model.base_s(first.batch_size) * min(t / sum(first.piece_s) for t in first.piece_s)
            else:
                unit_s = model.base_s(1 if a.any_batch_size else model.sizes[0])
            units.append(unit_s * model.factor())
        if not units:
            return 0.0
        return self.switch.predict_s() + self.settings.guard_s + min(units)

    def _steps(
        self,
        name: str,
        a: ActiveJob,
        bubble: Any,
        deadline_ns: int,
        offered_s: float,
        model: StepModel,
        *,
        any_size: bool,
        pieces: PieceCosts | None,
    ) -> tuple[str, BubbleOutcome, int | None]:
        """Steps of job ``name`` in ``bubble`` with ``model``: (why nothing ran or "", outcome, largest batch)."""
        free = min(
            int(getattr(bubble, "free_bytes", 0) or 0) or self.settings.reserved_bytes, self.settings.reserved_bytes
        )
        margin = self.settings.margin_bytes if self.device.type == "cuda" else 0
        points = [p for p in a.profiler.points if p.peak_bytes <= free - margin]
        if not points:
            return "memory", BubbleOutcome(), None
        # never larger than the most efficient batch that fits the memory (by the step times measured since the
        # profile: a profile taken on a busy machine can be far off); smaller ones as the time left requires
        max_batch = max(points, key=lambda p: p.items / model.base_s(p.batch_size)).batch_size
        budget_s = self.settings.overrun_budget_s
        extra_s = a.margin.extra_s(budget_s)
        extra_ns = int(1e9 * min(extra_s, offered_s / 2))  # a job whose steps overran: planned earlier
        if extra_ns and not a.margin.warned:
            a.margin.warned = True
            log.warning(
                "job %s: its last steps of a bubble ran past the bubble's expected end by more than the guard of "
                "%.2f ms allows (over its last %d worked bubbles, %.0f µs a bubble on average with no margin); its "
                "bubbles are planned %.2f ms shorter from now on, the smallest margin that brings that mean within "
                "the overrun budget of %.0f µs (PIPEFILL_FILL_GUARD_MS sets the guard of every job, "
                "PIPEFILL_FILL_OVERRUN_BUDGET_US the budget)",
                name,
                self.settings.guard_s * 1e3,
                len(a.margin),
                a.margin.mean_past_s() * 1e6,
                extra_ns / 1e6,
                budget_s * 1e6,
            )
        with _guard(name):
            out = run_steps(
                bubble,
                task=a.task,
                max_batch=max_batch,
                model=model,
                commit_estimate=a.commit_estimate,
                is_open=self.is_open,
                deadline_ns=deadline_ns - extra_ns,
                device=self.device,
                kind=str(getattr(bubble, "kind", "")),
                any_size=any_size,
                budget_s=self.settings.overrun_budget_s,
                # offload starts with the complete profile (JobRunner.profiled moves the state to the host): the
                # early model's steps while it is measured leave the state where the profiling steps need it
                offloader=a.offloader if self.settings.offload and a.profile is not None else None,
                transfer_estimate=a.transfer_estimate,
                cost_clock=self.jobs.step_clock,
                pieces=pieces,
                continue_piece_s=self.settings.continue_piece_s,
                split_above_s=self.settings.split_above_s,
            )
        out.margin_ns = extra_ns
        a.margin.record(out, deadline_ns=deadline_ns - extra_ns, room_ns=bubble.expected_end_ns - deadline_ns)
        return "", out, max_batch

    def _job_for(self, bubble: Any, exclude: str | None = None) -> str | None:
        """The job whose class this bubble belongs to."""
        profiled = {n: a for n, a in self.jobs.active.items() if a.profile and a.profile.points and n != exclude}
        # a job whose slice is all stepped (its last commit being written) leaves the bubble to one with work left
        ready = {n: a for n, a in profiled.items() if not a.task.done()}
        if not ready and exclude is None:
            ready = profiled
        if not ready:
            return None
        if len(ready) == 1:
            return next(iter(ready))
        stale = self._generation != self.jobs.generation or self._bubbles_since_assign >= _REASSIGN_EVERY
        if (stale or not self._assignment) and exclude is None:
            self._reassign(ready)
        duration_s = (bubble.expected_end_ns - bubble.open_ns) / 1e9
        nearest = min(self._assignment, key=lambda d: abs(d - duration_s), default=None)
        name = self._assignment.get(nearest) if nearest is not None else None
        return name if name in ready else next(iter(ready))

    def _reassign(self, ready: dict[str, ActiveJob]) -> None:
        classes = classes_from_bubbles(self.recent_bubbles(), default_free_bytes=self.settings.reserved_bytes)
        jobs = [JobProfile(n, a.profile.points, a.spec.priority, a.spec.kind) for n, a in ready.items() if a.profile]
        assignment = assign_jobs(classes, jobs, guard_s=self.settings.guard_s, switch_s=self.switch.predict_s())
        self._assignment = {a.bubble.duration_s: a.job for a in assignment if a.job is not None}
        self._generation, self._bubbles_since_assign = self.jobs.generation, 0
        by_class = {f"{a.bubble.duration_s * 1e3:.3f}ms": a.job for a in assignment}
        self.events.write(AssignEvent(classes=by_class, jobs=list(ready)))
