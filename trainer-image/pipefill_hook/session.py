"""One process's hook state: the steps of its pipeline schedule, their compute actions and waits, the profile, the
announcer, metrics and event log.

:mod:`pipefill_hook.patch` reports what the wrapped calls do; this module decides what each means:

- a *training step* is one call of the schedule's ``step`` with backward (``eval`` is not one); it lasts until the
  next one begins (so it holds the optimizer and whatever the user does between steps);
- inside ``step``, each compute call of a stage (forward, backward, input or weight backward) is one action of this
  rank's order; a point-to-point wait belongs to the action that follows it (the index of that action), as in the
  trainer; waits after the last action (sends drained at the end of ``step``) are measured, never announced;
- the first blocking collective after ``step`` returned (the loss or gradient-norm all-reduce torchtitan and most
  scripts make) is the end-of-step wait, index ``len(actions)``, where the ranks that finished early wait for the
  slowest;
- steps ``0 .. K-1`` (``PIPEFILL_HOOK_PROFILE_STEPS``) announce nothing: step 0 is warm-up, the others are measured;
  after step ``K-1`` every rank's medians and order are gathered and simulated (:mod:`pipefill_hook.predict`) and the trainer's
  :class:`~pipefill_trainer.instrument.BubbleAnnouncer` announces from step ``K`` on, learning each slot's length
  from what it measures. A wait the order did not predict becomes a slot of its own.

A step's records and most of its metrics (the event log's ``step``, ``action`` and ``bubble`` lines, the bubble
metrics, the loss) are written in the next step's first wait long enough for them (:data:`BOOKS_MIN_WAIT_S`, and
twice what they took last time), before it is announced: there the rank idles anyway, where at the step's start they
delayed its first action (about half a millisecond a step on a CPU core the compute left cold). A step with no such
wait writes them at its end, as before. The step counters and the baseline are kept at once.

Everything here is bounded and never blocks on the fill. An exception in the hook's bookkeeping is not the
training's: the hook reports it once and stops announcing (:meth:`Session.disable`).
"""

from __future__ import annotations

import atexit
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Gauge

from pipefill.channel import Producer
from pipefill.events import TRAINER_EVENTS, ActionEvent, BubbleEvent, EventWriter, StepEvent
from pipefill.schedules.model import Action, Kind
from pipefill_hook.predict import Medians, gather, predict_slots, schedule_as_ran
from pipefill_hook.settings import HookSettings
from pipefill_trainer.baseline import NoFillSteps
from pipefill_trainer.devsync import device_uuids, free_bytes_fn
from pipefill_trainer.instrument import BubbleAnnouncer, stage_medians
from pipefill_trainer.metrics import TrainerMetrics

__all__ = ["Session", "StepTrace", "hook_gauge", "warn"]


def hook_gauge(registry: CollectorRegistry) -> Gauge:
    """``pipefill_trainer_hook_announcing`` (docs/metrics.md): what the hook does in this process."""
    return Gauge(
        "pipefill_trainer_hook_announcing",
        "The bubble hook (spec.trainer): 1 announces bubbles; 0 measures only (a torch it was not tested against, "
        "fill disabled, or the hook disabled itself after an error of its own).",
        registry=registry,
    )


def warn(message: str) -> None:
    print(f"pipefill hook: {message}", file=sys.stderr, flush=True)


BOOKS_MIN_WAIT_S = 1e-3
"""The shortest predicted wait a step's deferred records and metrics are written in (see the module docstring)."""


@dataclass
class StepTrace:
    """What one step did on this rank (monotonic ns)."""

    start_ns: int
    actions: list[Action] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    waits: list[tuple[int, int, int]] = field(default_factory=list)
    """(index of the action it precedes, start, end)"""
    losses: list[Any] = field(default_factory=list)


@dataclass
class _Books:
    """A finished step's records and metrics, still to be written (:meth:`Session.write_books`)."""

    step: int
    trace: StepTrace
    step_s: float
    records: list[Any]
    own_s: float
    wait_s: float


class Session:
    """See the module docstring. ``announce``: False on a torch the hook was not tested against (measure only)."""

    def __init__(self, settings: HookSettings, *, announce: bool, registry: CollectorRegistry | None = None) -> None:
        self.settings, self.announce = settings, announce
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics: TrainerMetrics | None = None
        self.announcing: Gauge | None = None
        self.events = EventWriter(settings.out_dir / TRAINER_EVENTS if settings.out_dir else None, flush_each=False)
        self.producer: Producer | None = None
        self.nofill: NoFillSteps | None = None
        self.announcer: BubbleAnnouncer | None = None
        self.actions: list[Action] | None = None
        self.mode = "profiling"
        self.step = -1
        self.trace: StepTrace | None = None
        self.in_step = False
        self.end_wait_pending = False
        self._durations: list[list[float]] = []
        self._free_bytes: Callable[[], int] = lambda: settings.reserved_bytes
        self._compute_start = 0
        self._last_wait: tuple[int, int] | None = None  # (step, action count) of the previous wait
        self._started = False
        self.disabled = False
        """set by :meth:`disable`: every wrapper passes straight through"""
        self._quiet = False
        self._profiling = True
        self.own_ns = 0
        """the hook's own time since the last step's record (:mod:`pipefill_hook.patch` adds its wrappers' time)"""
        self.wait_ns = 0
        """the deferred books written inside this step's waits (not in ``own_ns``)"""
        self._books: _Books | None = None
        self._books_ns = 0  # what the last books took to write

    # --- start ----------------------------------------------------------------------------------------------
    def start(self, *, stage_idx: int, num_stages: int, device: torch.device) -> None:
        """At the first training step: the metrics endpoint, the channel (fill enabled and a tested torch)."""
        self._started = True
        cuda = device.type == "cuda"
        self.metrics = TrainerMetrics(self.registry, device_index=(device.index or 0) if cuda else None)
        self.announcing = hook_gauge(self.registry)
        TrainerMetrics.serve(self.settings.metrics_port, self.registry)
        s = self.settings
        if self.announce and s.channel_dir is not None:
            self.producer = Producer.create(
                channel_dir=s.channel_dir,
                job_name=s.job_name,
                rank=s.rank,
                stage_idx=stage_idx,
                num_stages=num_stages,
                gpu_uuids=device_uuids(device),
            )
        self._free_bytes = free_bytes_fn(device, reserved_bytes=s.reserved_bytes)
        self.announcing.set(1 if self.producer is not None else 0)
        self.nofill = NoFillSteps(
            self.metrics, producer=self.producer, channel_dir=s.channel_dir, every_steps=s.baseline_every_steps
        )
        atexit.register(self.close)

    @property
    def started(self) -> bool:
        return self._started

    # --- steps ----------------------------------------------------------------------------------------------
    def step_begin(self) -> None:
        now = time.monotonic_ns()
        self.finish_step(now)
        self.step += 1
        self.trace = StepTrace(start_ns=now)
        self.in_step, self.end_wait_pending = True, False
        assert self.nofill is not None
        self._profiling = self.announcer is None
        self._quiet = self.nofill.quiet(self.step)
        if self.announcer is not None:
            self.announcer.begin_step(self.step, quiet=self._quiet)
        self.nofill.begin(quiet=self._quiet)

    def step_end(self, losses: Sequence[Any] | None, *, pp_rank: int, sched: Any) -> None:
        """``step`` returned: keep the losses (read at the step's end, not now: no device sync here), collect the
        profile, and after the last profiled step predict and install the announcer."""
        assert self.trace is not None
        self.in_step = False
        if losses:
            self.trace.losses = list(losses)
        try:
            self._profile(pp_rank=pp_rank, sched=sched)
        finally:
            self.end_wait_pending = True

    def _profile(self, *, pp_rank: int, sched: Any) -> None:
        assert self.trace is not None
        if self.announcer is not None:
            return
        if self.actions is None or self.trace.actions != self.actions:
            self.actions = list(self.trace.actions)  # step 0 (warm-up), or the order changed: profile afresh
            self._durations.clear()
        elif self.step > 0:
            self._durations.append([(e - s) / 1e9 for s, e in self.trace.spans])
        # the same step on every rank, whatever each measured: the exchange is a collective
        if self.step == self.settings.profile_steps - 1 and self.announce:
            own = stage_medians(self.actions, self._durations) if self._durations else {}
            self._install(own, pp_rank=pp_rank, sched=sched)

    def _install(self, own: Medians, *, pp_rank: int, sched: Any) -> None:
        assert self.actions is not None
        got = gather(own, pp_rank=pp_rank, order=self.actions)
        prediction = predict_slots(schedule_as_ran(got.orders, type(sched).__name__), pp_rank, got.medians)
        self.mode = prediction.mode
        out = self.settings.out_dir
        if out is not None and prediction.profile is not None and prediction.timeline is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "profile.json").write_text(json.dumps(prediction.profile, indent=1))
            timeline = prediction.timeline.to_dict(with_actions=False)
            (out / "timeline.json").write_text(json.dumps(timeline, indent=1))
        self.announcer = BubbleAnnouncer(
            actions=self.actions,
            slots=prediction.slots,
            producer=self.producer,
            min_bubble_s=self.settings.min_bubble_s,
            free_bytes=self._free_bytes,
            late_after_s=self.settings.late_after_s,
        )
        slots = ", ".join(f"{s.kind}@{s.action_idx}={s.predicted_s * 1e3:.2f}ms" for s in prediction.slots.values())
        why = f" ({prediction.why}: learning each wait's length)" if prediction.why else ""
        warn(f"rank {self.settings.rank} profiled; bubbles {prediction.mode}{why}: {slots or 'none yet'}")

    # --- compute and waits ----------------------------------------------------------------------------------
    def compute_begin(self) -> None:
        self._compute_start = time.monotonic_ns()

    def compute_end(self, stage_idx: int, kind: Kind, mb_idx: int) -> None:
        if self.in_step and self.trace is not None:
            self.trace.actions.append(Action(stage_idx, kind, mb_idx))
            self.trace.spans.append((self._compute_start, time.monotonic_ns()))

    def wait_index(self) -> int | None:
        """The action the wait starting now precedes; None: not a wait of a step."""
        if self.in_step and self.trace is not None:
            return len(self.trace.actions)
        if self.end_wait_pending and self.trace is not None:
            return len(self.actions) if self.actions is not None else len(self.trace.actions)
        return None

    def wait_begin(self, idx: int, done: Callable[[], bool]) -> int:
        """The rank blocks now before action ``idx``; returns the start (ns)."""
        start = time.monotonic_ns()
        a = None if self._profiling else self.announcer  # installed after this step's end: from the next one
        if a is None or self._drain(idx):
            return start
        if self._books is not None and self._books_fit(a, idx):
            self.write_books()  # the rank idles now anyway: before the bubble is announced
            end = time.monotonic_ns()
            self.wait_ns += end - start
            start = end
        if self._last_wait != (self.step, idx):  # a second wait before the same action extends the first
            a.wait_begin(idx)
            a.while_waiting(idx, done)
        return start

    def _books_fit(self, a: BubbleAnnouncer, idx: int) -> bool:
        """Whether the wait before ``idx`` is predicted long enough for the deferred books."""
        slot = a.slots.get(idx)
        return slot is not None and slot.predicted_s >= max(BOOKS_MIN_WAIT_S, 2 * self._books_ns / 1e9)

    def wait_end(self, idx: int, start_ns: int) -> None:
        assert self.trace is not None
        self.trace.waits.append((idx, start_ns, time.monotonic_ns()))
        if self.announcer is not None and not self._profiling and not self._drain(idx):
            self.announcer.wait_end(idx)
            self._last_wait = (self.step, idx)
        if not self.in_step:
            self.end_wait_pending = False

    def _drain(self, idx: int) -> bool:
        """Waits the announcer never sees: after the last action inside ``step`` (sends drained)."""
        return self.in_step and self.actions is not None and idx >= len(self.actions)

    # --- the step's end -------------------------------------------------------------------------------------
    def finish_step(self, now_ns: int) -> None:
        """The step that began at ``trace.start_ns`` is over (the next one begins, or the process ends): its counters
        and baseline now, its records and the rest of its metrics in a wait of the next step (the module docstring)."""
        t, m = self.trace, self.metrics
        if t is None or m is None or self.nofill is None:
            return
        self.trace = None
        if self._books is not None:
            self.write_books()  # no wait of this step was long enough for the step before's
        step_s = (now_ns - t.start_ns) / 1e9
        m.step_seconds.observe(step_s)
        m.steps.inc()
        m.step.set(self.step + 1)
        self.nofill.end(step_s=step_s, profiling=self._profiling, quiet=self._quiet)
        records = self.announcer.end_step() if self.announcer is not None and not self._profiling else []
        own_s, self.own_ns = self.own_ns / 1e9, 0  # this bookkeeping is counted in the next step's
        wait_s, self.wait_ns = self.wait_ns / 1e9, 0
        self._books = _Books(self.step, t, step_s, list(records), own_s, wait_s)
        if self._profiling:
            self.write_books()  # no announcer, so no wait takes them; the profiling steps are not timed
        if self.producer is not None:
            self.producer.heartbeat()

    def write_books(self) -> None:
        """Write the deferred records and metrics of the last finished step (see the module docstring)."""
        b, m = self._books, self.metrics
        if b is None or m is None:
            return
        self._books = None
        started = time.monotonic_ns()
        loss = _mean(b.trace.losses)
        if not math.isnan(loss):
            m.loss.set(loss)
        for rec in b.records:
            measured_s = (rec.end_ns - rec.start_ns) / 1e9
            m.observe_bubble(kind=rec.kind, measured_s=measured_s, predicted_s=rec.predicted_s, announced=rec.announced)
            self.events.write(
                BubbleEvent(step=b.step, idx=rec.action_idx, kind=rec.kind, start_ns=rec.start_ns, end_ns=rec.end_ns,
                            predicted_s=rec.predicted_s, announced=rec.announced, late=rec.late)
            )  # fmt: skip
        if self.events.enabled:
            for idx, (a, (s, e)) in enumerate(zip(b.trace.actions, b.trace.spans, strict=True)):
                self.events.write(ActionEvent(step=b.step, idx=idx, action=str(a), start_ns=s, end_ns=e))
        self.events.write(
            StepEvent(step=b.step, loss=loss, step_s=b.step_s, tokens_per_s=0.0, start_ns=b.trace.start_ns,
                      hook_s=b.own_s, hook_wait_s=b.wait_s)
        )  # fmt: skip
        self.events.flush()
        self._books_ns = time.monotonic_ns() - started

    def close(self) -> None:
        """At exit: the last step ends now; the channel is closed."""
        try:
            self.finish_step(time.monotonic_ns())
            self.write_books()
            self.events.close()
        finally:
            if self.producer is not None:
                self.producer.close()
                self.producer = None

    def disable(self, exc: BaseException) -> None:
        """The hook failed: from now on it does nothing at all (training goes on untouched); said once."""
        if self.disabled:
            return
        self.disabled = True
        warn(f"disabled after an error of its own ({type(exc).__name__}: {exc}); training continues unannounced")
        self.announcer, self.announce, self.trace = None, False, None
        if self.announcing is not None:
            self.announcing.set(0)
        if self.producer is not None:
            self.producer.close()
            self.producer = None


def _mean(losses: Sequence[Any]) -> float:
    """The mean of the step's microbatch losses; a scalar tensor is read as it is (``item``: 4 µs), not through three
    new tensors (70 µs each on a CPU, four a step)."""
    values = [_value(x) for x in losses]
    return sum(values) / len(values) if values else float("nan")


def _value(x: Any) -> float:
    if not isinstance(x, torch.Tensor):
        return float(x)
    return float(x.item()) if x.numel() == 1 else float(x.detach().float().mean())
