"""The profiler: per candidate batch size, median step time and peak memory on the actual device, after warm-up.

Measurements are cached per (workload, device) where every job of the workload finds them
(:mod:`pipefill_fill.profilecache`) and taken again when either changes (the workload's code or parameters, the device
model, torch version or thread count). An inference job's measured steps are its real work: each processes the next
batch of its slice, and its outputs are committed as any step's (:attr:`BubbleProfiler.productive`). A training job's
state is snapshotted before and restored after each measured step, and its outputs are dropped, so measuring does
not move its optimizer; nor does :func:`profile_task`, the whole profile at once.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` after a reset; on CPU, the growth of the process's resident
set high-water mark (``VmHWM`` after resetting it through ``/proc/self/clear_refs``), 0 where Linux does not offer it.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch

from pipefill.plan import ProfilePoint
from pipefill_fill.device import device_sync, memory_peak, memory_reset
from pipefill_fill.pieces import PieceSteps, piece_steps
from pipefill_fill.profilecache import (
    Profile,
    device_key,
    full_points,
    load_cached,
    partial_points,
    store_profile,
    store_unfinished,
)
from pipefill_fill.profileonce import profile_task, stop_after
from pipefill_fill.task import FillTask

__all__ = ["PROFILE_BOUND", "BubbleProfiler", "Profile", "device_key", "load_cached", "profile_task", "store_profile"]

log = logging.getLogger("pipefill_fill")

SPELL = 3.0
"""A measurement this many times slower than the previous size scaled to this one was stretched by the machine (the
step model's ``INTERRUPTED``): :meth:`BubbleProfiler.give_up_candidate` drops it once before giving the size up."""

PROFILE_BOUND = 1.5
"""A measurement in a bubble is bounded by this many times its prediction, the slowest step of its size measured so
far included, plus the measurement's own overhead (restoring the snapshot, memory accounting): a profiling step is a
first look at a size, whose cost is what is being measured, so it is planned with a margin a known step does not need
(issue #31: profiling steps were the demo's overruns)."""


class BubbleProfiler:
    """Profiles a task one measured step at a time, so the runner can run the measurements inside bubbles.

    The runner asks :meth:`next_bound_s` (None: unknown, only the very first step) and calls :meth:`measure_next` (a
    step, or one piece of it) while the bound fits the bubble; :attr:`result` is set once every candidate is measured.
    """

    def __init__(
        self,
        task: FillTask,
        device: torch.device,
        *,
        memory_budget_bytes: int,
        warmup: int = 2,
        repeats: int = 5,
        max_step_s: float = 1.0,
        first_guess_s: float | None = None,
        clock: Callable[[], int] = time.monotonic_ns,  # what a step costs: pipefill_fill.device.step_clock
    ) -> None:
        self.task, self.device, self.clock = task, device, clock
        self.budget, self.warmup, self.repeats, self.max_step_s = memory_budget_bytes, warmup, repeats, max_step_s
        self.first_guess_s = first_guess_s
        self.hints: dict[int, float] = {}
        """batch size → seconds of a warm step, measured before the first bubble (``FillTask.warm_up``)"""
        self.result: Profile | None = load_cached(task, device, memory_budget_bytes=memory_budget_bytes)
        self._device_key = device_key(device)
        self._unstored = False  # a profile completed in a bubble, written to the cache after it (:meth:`store`)
        self._overhead_s = 0.0  # the most a measurement took beyond its step (restore, memory accounting)
        self.candidates = task.batch_sizes()
        self._i = 0
        self._times: list[float] = []
        self._items = 0
        self.productive = task.spec.kind == "inference"
        """the measured steps do the job's work (inference: the next batches of the slice, outputs kept) instead of
        being undone (training: a measured optimizer step would move the weights). In a queue of small inference jobs
        a job's measured sizes were work thrown away: 7 steps of each size, more than some jobs' samples"""
        self.last_items = 0  # units of work the last measurement part completed (productive measurements only)
        self._peak = 0
        self._points: list[ProfilePoint] = []
        self._piece_times: list[list[float]] = []  # per measured step of the candidate: its pieces' seconds
        self._partial: list[float] | None = None  # the step being measured in pieces: its pieces' seconds so far
        self._base = 0  # the memory accounting's start of that step
        self._snapshot: dict[str, object] | None = None
        self.misses = 0  # consecutive bubbles the next measurement did not fit in
        self._retried = False  # the current candidate was measured again between bubbles once (give_up_candidate)
        self.retry_due = False  # and its next measurement is taken between bubbles: it may really be that slow
        # why the last candidate was not kept: "memory" (over budget, out of memory), "time" (it fits no bubble),
        # "work" (the slice had no work left to measure it with)
        self.stopped_by = ""
        self.last_step_s: float | None = None  # the last candidate's step time, measured or predicted
        self.last_peak_bytes: int | None = None  # the last candidate's peak device memory, when measured
        if self.result is None:  # a smaller job's sizes, where one was cut short: not measured again
            self._go_on_from(partial_points(task, device, memory_budget_bytes=memory_budget_bytes))

    @property
    def batch_size(self) -> int:
        return self.candidates[self._i]

    @property
    def measured(self) -> bool:
        """Whether some batch size is measured already (giving up the next one still leaves a profile)."""
        return bool(self._points)

    def predict_s(self) -> float | None:
        """The next measurement's expected duration; None: unknown (the runner starts it only at a bubble's start).

        The very first step of a fresh job pays one-off costs (lazy initialization, first allocations) that can make
        it ten times slower than the next: it is never taken as a prediction, or a job whose bubbles are a few
        milliseconds long would wait for bubbles that fit its slow first step, and give up. Later, the lower median
        of what was measured: a step that another process interrupted would otherwise do the same. A candidate not
        measured yet is predicted by its warm step before the first bubble (:attr:`hints`), or, larger, by the
        previous candidate scaled linearly (a size that grows worse than linearly would otherwise overrun)."""
        usable = self._times if self._points else self._times[1:]
        if len(usable) >= 3:  # the lower median: one step another process interrupted must not stop the profile
            return statistics.median_low(usable)
        if usable:  # warm-up: the fastest so far
            return min(usable)
        hint = self.hints.get(self.batch_size)  # measured outside bubbles: the larger of it and the scaling
        if self._points:
            last = self._points[-1]
            return max(last.step_s * self.batch_size / last.batch_size, hint or 0.0)
        return hint if hint is not None else self.first_guess_s

    def bound_s(self) -> float | None:
        """What the next measurement may take at most, for planning it into a bubble (:data:`PROFILE_BOUND`); None:
        unknown (see :meth:`predict_s`)."""
        guess = self.predict_s()
        if guess is None:
            return None
        slowest = max(self._times if self._points else self._times[1:], default=0.0)
        return PROFILE_BOUND * max(guess, slowest) + self._overhead_s

    def measure_one(self) -> float:
        """One whole measured step of the current candidate (all its pieces at once); returns its duration."""
        duration_s = self.measure_next()
        while self._partial is not None:
            duration_s += self.measure_next()
        return duration_s

    def measure_next(self) -> float:
        """The next part of a measured step of the current candidate: one piece where the workload runs its steps in
        pieces (a step longer than any bubble is measured across bubbles, each piece timed: issue #31, a 30 ms step
        measured whole in 10 ms bubbles overran each by 20 ms), else the whole step. A productive step is the slice's
        next batch (:attr:`last_items` says what it completed); otherwise the workload's state is put back to the
        snapshot when a step starts. Pieces in flight stay on the device between bubbles. Returns the part's
        seconds."""
        entered = self.clock()
        self.last_items = 0
        if self.out_of_work():
            return 0.0
        if self._snapshot is None and not self.productive:
            self._snapshot = self.task.snapshot()
            self.task.begin_profiling()
        bs = self.batch_size
        pieces = piece_steps(self.task.workload) if self.task.use_pieces else None
        if self._partial is None:  # a new step: the slice's next batch, or the snapshot again
            self._base = memory_reset(self.device)
            if self._snapshot is not None:
                self.task.workload.restore(dict(self._snapshot))
            self._partial = []
        try:
            t0 = self.clock()
            self._items = self._step(bs, pieces)
            device_sync(self.device)
            part_s = (self.clock() - t0) / 1e9
        except torch.OutOfMemoryError:
            log.info("profile %s: batch %d ran out of device memory", self.task.spec.name, bs)
            self.stopped_by = "memory"
            self._finish()
            return 0.0
        self._partial.append(part_s)
        if pieces is not None and pieces.in_flight() is not None:  # more pieces to come
            self._overhead_s = max(self._overhead_s, (self.clock() - entered) / 1e9 - part_s)
            return part_s
        step, self._partial = self._partial, None
        self.task.saw_shape(bs)
        # the slice's work ran out (its job worked meanwhile with the sizes measured so far); a productive step that
        # did fewer than its batch was the slice's last, clipped: work done, but no measurement of the size
        if self._items <= 0 or (self.productive and self._items < bs):
            self._peak = max(self._peak, memory_peak(self.device, self._base))
            self._work_ran_out((sum(step), self._items) if self._items > 0 else None)
            return part_s
        if pieces is not None:
            self._piece_times.append(step)
        self._peak = max(self._peak, memory_peak(self.device, self._base))
        self._times.append(sum(step))
        self.retry_due = False
        self._overhead_s = max(self._overhead_s, (self.clock() - entered) / 1e9 - part_s)
        if len(self._times) >= self.warmup + self.repeats:
            self._next_candidate()
        return part_s

    def out_of_work(self) -> bool:
        """Whether a productive profile has no work left to measure with (its measured steps, or its job's steps with
        the sizes measured so far, did the slice's last): then it ends with the sizes measured (``stopped_by``
        "work"), as a measurement that found no work does."""
        if not self.productive or self._partial is not None or self.result is not None or not self.task.done():
            return False
        self._work_ran_out()
        return True

    def _work_ran_out(self, clipped: tuple[float, int] | None = None) -> None:
        """The slice's work ran out before the current candidate was measured in full (``clipped``: the seconds and
        units of its last batch, cut short by the slice's end). A productive profile keeps the candidate where it
        measured a full batch of it (past the warm-up where it could, else its warm-up steps, whose first calls were
        made before the first bubble: in a queue of small jobs the larger sizes are measured across the jobs instead
        of by none, and a job that runs out while measuring its last size completes the profile for the others); the
        first size also from its one cut-short batch (a slice smaller than it), as a profile with no size would leave
        the job unable to commit its work. The profile ends with the sizes measured (``stopped_by`` "work", cached as
        incomplete), unless that candidate was the last."""
        keep: tuple[list[float], int] | None = None
        if self.productive and len(self._times) > self.warmup:
            keep = self._times[self.warmup :], self.batch_size
        elif self.productive and self._times:  # its warm-up steps only: the work left no more (warm already)
            keep = self._times, self.batch_size
        elif self.productive and not self._points and clipped is not None:
            keep = [clipped[0]], clipped[1]
        if keep is not None:
            self._next_candidate(times=keep[0], items=keep[1])
            if self.result is not None:
                return
        self._times, self._peak, self._piece_times = [], 0, []
        self.stopped_by = "work"
        self._finish()

    def _step(self, bs: int, pieces: PieceSteps | None) -> int:
        """One measured step (or piece) of ``bs``: the task's own (productive: progress and outputs kept; the last
        units clipped to the slice's end), else the workload's from the snapshot. Returns the units it completed."""
        if self.productive:
            self.last_items = self.task.step(bs) if pieces is None else self.task.step_piece(bs)
            return self.last_items
        return int(self.task.workload.step(bs) if pieces is None else pieces.step_piece(bs))

    @property
    def mid_step(self) -> bool:
        """Whether a step is being measured in pieces (the workload's state holds its batch in flight: real steps
        would drop it with :meth:`pause`, and the measurement would start again in every bubble)."""
        return self._partial is not None

    def next_bound_s(self) -> float | None:
        """What the next part of a measurement (:meth:`measure_next`) may take at most; None: unknown. A piece's
        share of :meth:`bound_s`: the largest share measured for it in this candidate's steps, else an equal share
        of the workload's pieces (only the first candidate is measured piece by piece: :func:`run_profile_steps`)."""
        bound = self.bound_s()
        pieces = piece_steps(self.task.workload) if self.task.use_pieces else None
        if bound is None or pieces is None:
            return bound
        done = len(self._partial) if self._partial is not None else 0
        shares = [m[done] / sum(m) for m in self._piece_times if len(m) > done and sum(m) > 0]
        share = max(shares) if shares else 1.0 / max(1, int(pieces.pieces(self.batch_size)))
        return bound * share + self._overhead_s

    @property
    def points(self) -> tuple[ProfilePoint, ...]:
        """The batch sizes measured so far (the whole profile once complete): a job works with them while the larger
        candidates are still being measured (:mod:`pipefill_fill.dispatch`)."""
        return self.result.points if self.result is not None else tuple(self._points)

    def pause(self) -> None:
        """Put the workload back where the measurements started (their outputs dropped), so real steps may run; the
        next measurement starts from the state those steps leave."""
        self._partial = None  # a step in flight is dropped with the state (measured again from its start)
        if self._snapshot is not None:
            self.task.end_profiling(self._snapshot)
            self._snapshot = None

    def adopt(self, profile: Profile) -> None:
        """Take ``profile`` (another job of the workload just cached it) instead of measuring further."""
        self.pause()
        self.result = profile

    def carry_on(self, last: BubbleProfiler) -> bool:
        """The job's next slice, after ``last`` (the profiler of its slice before): a complete profile carries over
        (the cache's, else ``last``'s); one that the last slice's work cut short (``stopped_by`` "work": not cached, or
        cached for smaller jobs only) goes on from the sizes it measured, with the larger candidates. Returns whether
        this slice has a profile to take in when complete (the job has not taken it in: measuring it again was
        skipped, and the job waited without a profile for good, issue #31's user-code stall)."""
        if self.result is not None:
            return False
        if last.result is not None and last.stopped_by != "work":
            self.result = last.result
            return False
        self._go_on_from(full_points(self.task, last.points))
        return True

    def _go_on_from(self, points: list[ProfilePoint]) -> None:
        """Sizes measured already (by the job's last slice, or by a smaller job of the workload): kept, and the profile
        goes on with the larger candidates (complete when there is none)."""
        if points:
            largest = max(p.batch_size for p in points)
            self._points = sorted(points, key=lambda p: p.batch_size)
            self._i = next((i for i, b in enumerate(self.candidates) if b > largest), len(self.candidates))
            if self._i >= len(self.candidates):
                self._finish()

    def store_unfinished(self) -> None:
        """Its job is let go of with the profile not complete: the sizes measured are cached for the next job of the
        workload to go on from (:func:`pipefill_fill.profilecache.store_unfinished`)."""
        if self.result is None:
            store_unfinished(self.task, self.device, self._points, budget=self.budget)

    def give_up_candidate(self) -> None:
        """The current candidate does not fit the bubbles offered: keep the batch sizes measured so far. But first, once
        per candidate, it is measured between bubbles (``retry_due``), its measurements above :data:`SPELL` times what
        the previous size predicts for it dropped: its bound (1.5 × its slowest measurement, or × the previous size
        scaled linearly before any) may not fit what a bubble leaves although the size does (the encoder's steps grow
        far slower than linearly: profiles that stopped at batch size 2 or 4 at 10 ms bubbles left every job of the
        workload at a third of the samples per bubble, issue #31), or a slow spell stretched one measurement. A size
        that is too slow measures so again, and is given up then, without a bubble running it."""
        if not self._retried and self._points:
            last = self._points[-1]
            limit = SPELL * last.step_s * self.batch_size / last.batch_size
            keep = [i for i, t in enumerate(self._times) if t <= limit]
            if len(self._piece_times) == len(self._times):
                self._piece_times = [self._piece_times[i] for i in keep]
            self._times = [self._times[i] for i in keep]
            self._retried, self.retry_due, self.misses = True, True, 0
            return
        self.stopped_by, self.last_step_s = "time", self.predict_s()
        self._finish()

    def _next_candidate(self, *, times: list[float] | None = None, items: int | None = None) -> None:
        """The current candidate is measured: ``times`` its measured steps' seconds (else those past the warm-up),
        ``items`` the units each did (else the last step's)."""
        bs = self.batch_size
        items = self._items if items is None else items
        times = self._times[self.warmup :] if times is None else times
        measured = self._piece_times[-len(times) :] if len(self._piece_times) >= len(times) else []
        piece_s = (
            ()
            if not measured or len({len(m) for m in measured}) != 1
            else tuple(map(statistics.median, zip(*measured, strict=True)))
        )
        point = ProfilePoint(
            bs,
            statistics.median(times),
            self._peak,
            None if items == bs else items,
            piece_s=piece_s,
        )
        self._times, self._peak, self._piece_times, self._retried = [], 0, [], False
        self.last_step_s, self.last_peak_bytes = point.step_s, point.peak_bytes
        if point.peak_bytes > self.budget:
            self.stopped_by = "memory"
            self._finish()
            return
        self._points.append(point)
        self._i += 1
        if stop_after(self.task, point, self.max_step_s) or self._i >= len(self.candidates):
            self._finish()

    def _finish(self) -> None:
        """The profile is complete: the job's own points now; the cache file is written after the bubble (:meth:`store`:
        file I/O has no place in a bubble's budget)."""
        self._partial = None
        if self._snapshot is not None:
            self.task.end_profiling(self._snapshot)
            self._snapshot = None
        self.result = Profile(self.task.spec.workload_id, self._device_key, tuple(self._points))
        self._unstored = True

    def store(self) -> None:
        """Between bubbles: write a profile completed in a bubble to the cache, for every job of the workload (not one
        cut short because the training job ran out of work: another would take it for complete; an inference one is
        recorded as incomplete and serves only jobs no larger than its largest batch)."""
        if self._unstored and (self.stopped_by != "work" or self.task.spec.kind == "inference"):
            self._unstored = False
            store_profile(
                self.task, self.device, self._points, memory_budget_bytes=self.budget, stopped_by=self.stopped_by
            )
