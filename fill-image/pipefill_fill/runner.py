"""The runner: wait for a bubble, fill it, acknowledge; manage jobs between bubbles; stop when the trainer is gone.

One process, one thread. Around the loop here: :mod:`pipefill_fill.dispatch` picks the job and batch size of a bubble
and runs its steps (the hot path is :mod:`pipefill_fill.inbubble`); :mod:`pipefill_fill.jobs` claims slices of jobs
from the work source, moves from slice to slice, completes, fails and releases them.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from pipefill.events import EventWriter, ExitEvent, FillEvent, HoldEvent
from pipefill.plan import ObservedBubble
from pipefill_fill import collect
from pipefill_fill.dispatch import Dispatcher, JobError
from pipefill_fill.inbubble import BubbleOutcome
from pipefill_fill.jobs import Jobs
from pipefill_fill.metrics import FillMetrics
from pipefill_fill.overruns import overrun_cause, took_core
from pipefill_fill.predict import EndModel, Estimator
from pipefill_fill.settings import Settings
from pipefill_fill.sources import WorkSource
from pipefill_fill.steptrace import mark
from pipefill_fill.store import Superseded

__all__ = ["HANDOFF_MIN_S", "HOLD_POLL_S", "Attached", "Link", "Runner"]

log = logging.getLogger("pipefill_fill")

HOLD_POLL_S = 0.02
"""While held (``fill.hold`` in the channel directory), how often the executor looks whether it may work again."""


HANDOFF_MIN_S = 0.001
"""The least time before a bubble's deadline worth handing to another job when one's slice runs out of work in it."""


class Link(Protocol):
    """What the runner needs of the bubble channel (pipefill_fill.attach adapts the channel's consumer to it)."""

    def wait_bubble(self, timeout_s: float) -> Any: ...

    def is_open(self, bubble_id: int) -> bool: ...

    def acknowledge(self, bubble_id: int, *, used_s: float, overrun_s: float, work: int) -> None: ...

    def trainer_alive(self) -> bool: ...

    def hold_requested(self) -> bool: ...

    def close_of(self, bubble: Any) -> int: ...

    def recent_bubbles(self) -> list[ObservedBubble]: ...

    def publish_floor(self, floor_s: float) -> None: ...


@dataclass(frozen=True)
class Attached:
    """What the executor's start-up (``pipefill_fill.__main__``) hands to the runner of the work: the channel, the
    work source, the device and the settings, metrics and event log (the same for :class:`Runner` and the benchmark's
    naive runner, so both sides of a comparison share every setting)."""

    link: Link
    source: WorkSource
    device: torch.device
    settings: Settings
    metrics: FillMetrics
    events: EventWriter


class Stoppable:
    """The stop of an executor's loop, the same for :class:`Runner` and the benchmark's naive runner: the first
    reason asked for is kept (and logged); ``_exit`` records it in the event log and closes the work source."""

    source: WorkSource
    events: EventWriter
    _stop: str = ""

    def _request_stop(self, why: str) -> None:
        if not self._stop:
            self._stop = why
            log.info("stopping: %s", why)

    def _exit(self) -> int:
        self.events.write(ExitEvent(reason=self._stop))
        self.source.close()
        return 0


class Runner(Stoppable):
    def __init__(
        self,
        attached: Attached,
        *,
        max_active: int | None = None,  # None: PIPEFILL_FILL_MAX_ACTIVE_JOBS
        poll_interval_s: float = 5.0,
        trainer_grace_s: float = 1.0,
    ) -> None:
        link, source, device, settings = attached.link, attached.source, attached.device, attached.settings
        metrics, events = attached.metrics, attached.events
        self.link, self.source, self.device, self.settings = link, source, device, settings
        self.metrics, self.events = metrics, events
        self.poll_interval_s = poll_interval_s
        self.trainer_grace_s = trainer_grace_s  # a restarted trainer re-creates the channel within this; else stop
        self.jobs = Jobs(
            source=source,
            device=device,
            settings=settings,
            metrics=metrics,
            events=events,
            max_active=max_active,
            recent_bubbles=link.recent_bubbles,
        )
        self.switch = Estimator(default_s=0.0005, window=64, quantile=0.9)
        self.dispatcher = Dispatcher(
            jobs=self.jobs,
            is_open=link.is_open,
            recent_bubbles=link.recent_bubbles,
            device=device,
            settings=settings,
            switch=self.switch,
            events=events,
        )
        self._next_poll = 0.0
        self._polled = (-1, 0)  # the active jobs' generation and how many were finishing, at the last poll
        self._stop = ""
        self._held = False
        self._released_ns = 0  # when the last hold ended: a bubble that opened while held stays the trainer's
        self.ends = EndModel(quantile=settings.end_quantile)
        self._prev: Any = None  # the bubble before, whose close the end model learns from
        # the trainer takes its core back the moment it wakes: a step it preempted held nothing (overruns.py)
        self._preemptible = device.type == "cpu" and os.sched_getscheduler(0) == os.SCHED_IDLE

    # -- the loop -------------------------------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._request_stop("SIGTERM"))
        dead_since: float | None = None
        collect.start()  # the garbage collector runs between bubbles only
        while not self._stop:
            collect.between_bubbles()
            self.jobs.settle()  # commits the writer finished; slices whose work is all written move on
            # a job that left (finished, failed, let go) makes room: the next one is claimed and prepared now, before
            # the next bubble, not at the next poll (up to poll_interval_s of bubbles without it)
            # (or one whose work is all stepped: only its last commit is left)
            changed = (self.jobs.generation, self.jobs.finishing()) != self._polled
            room = changed and self.jobs.room()
            if room or time.monotonic() >= self._next_poll or not self.jobs.active or self.source.changed():
                self._next_poll = time.monotonic() + self.poll_interval_s
                self.jobs.refresh()
                self._polled = (self.jobs.generation, self.jobs.finishing())
            held = self.link.hold_requested()
            if held != self._held:
                self._held = held
                if not held:
                    self._released_ns = time.monotonic_ns()
                self.events.write(HoldEvent(held=held))
                log.info("fill %s", "held: taking no bubbles" if held else "released: working in bubbles again")
            if not held:
                self._between()
            bubble = None if held else self.link.wait_bubble(0.25 if self.jobs.active else 1.0)
            if bubble is None:
                if self.link.trainer_alive():
                    dead_since = None
                elif dead_since is None:
                    dead_since = time.monotonic()
                elif time.monotonic() - dead_since >= self.trainer_grace_s:
                    self._request_stop("trainer gone")
                if held:  # asleep off the futex, so the trainer's announcements wake nobody
                    time.sleep(HOLD_POLL_S)
                continue
            dead_since = None
            if bubble.open_ns < self._released_ns:  # opened during a hold (an A block): not ours to fill
                self.link.acknowledge(bubble.id, used_s=0.0, overrun_s=0.0, work=0)
                continue
            quiet = self.jobs.writer.quiet  # no commit written while the bubble is filled (pipefill_fill.commits)
            quiet.enter()
            try:
                self._on_bubble(bubble, woke_ns=time.monotonic_ns())
            finally:
                quiet.leave()
        self.jobs.shutdown()
        collect.stop()
        return self._exit()

    def _on_bubble(self, bubble: Any, *, woke_ns: int) -> None:
        woke = mark() if self._preemptible else None  # only a fill the trainer can preempt asks who had the core
        switch_s = max(0, woke_ns - bubble.open_ns) / 1e9
        self.switch.record(switch_s)
        self.metrics.switch_seconds.observe(switch_s)
        prev, self._prev = self._prev, bubble
        if prev is not None and (close_ns := self.link.close_of(prev)):
            self.ends.record((str(prev.kind), prev.mb_idx), close_ns, prev.expected_end_ns)
        end_ns = self.ends.end_ns((str(bubble.kind), bubble.mb_idx), bubble.expected_end_ns)
        deadline_ns = end_ns - int(self.settings.guard_s * 1e9)
        offered_s = (bubble.expected_end_ns - bubble.open_ns) / 1e9
        job, reason, out, batch = self._fill(bubble, deadline_ns, offered_s)
        handoff, handoff_items = None, 0
        if self._hand_off(job, out, bubble, deadline_ns):  # the job's slice ran out of work: the rest goes on
            assert job is not None  # for mypy: _hand_off says so
            handoff, _, rest, _ = self._fill(bubble, deadline_ns, offered_s, exclude=job)
            if handoff is not None:
                handoff_items = rest.items
                out.extend(rest)
        yielded_ns = time.monotonic_ns()
        closed_ns = self.link.close_of(bubble) if out.steps else 0  # 0: still open
        overrun_s = max(0, yielded_ns - bubble.expected_end_ns) / 1e9 if out.steps else 0.0
        took = (
            woke is not None
            and 0 < closed_ns < yielded_ns
            and took_core(
                preemptible=self._preemptible,
                closed_ns=closed_ns,
                yielded_ns=yielded_ns,
                involuntary=mark().involuntary - woke.involuntary,
            )
        )
        # the device is the trainer's again once the fill's last work on it ended (the host code after it holds none)
        held_ns = max(e for _, e in [*out.spans_ns, *out.commits_ns, *out.transfers_ns]) if out.steps else 0
        trainer_wait_s = max(0, held_ns - closed_ns) / 1e9 if closed_ns and not took else 0.0
        cause = None
        if overrun_s > self.settings.guard_s:
            cause = overrun_cause(out, expected_end_ns=bubble.expected_end_ns, yielded_ns=yielded_ns, preempted=took)
            self.metrics.overruns.labels(cause).inc()
        used_s = (out.busy_ns + out.commit_ns + out.transfer_ns) / 1e9
        self.link.acknowledge(bubble.id, used_s=used_s, overrun_s=overrun_s, work=out.items)
        self.metrics.bubble(offered_s=offered_s, busy_s=used_s, overrun_s=overrun_s, used=out.steps > 0)
        if not out.steps:
            self.metrics.bubbles_skipped.labels(reason or out.stop or "time").inc()
        if job is not None and out.items - handoff_items:
            self.metrics.items.labels(job).inc(out.items - handoff_items)
        if handoff is not None and handoff_items:
            self.metrics.items.labels(handoff).inc(handoff_items)
        self.events.write(
            FillEvent(
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
                overrun_cause=cause,
                margin_s=round(out.margin_ns / 1e9, 9),
                closed_ns=closed_ns,
                trainer_wait_s=round(trainer_wait_s, 9),
                commit_s=round(out.commit_ns / 1e9, 9),
                stop=out.stop or reason,
                spans_ns=out.spans_ns,
                step_trace=[t.row() for t in out.traces],
                step=getattr(bubble, "step", None),
                batch_sizes=out.batch_sizes,
                commits_ns=out.commits_ns,
                deadline_ns=deadline_ns,
                handoff=handoff,
                handoff_items=handoff_items,
                span_kinds="".join(out.kinds),
            )
        )
        for name in (job, handoff):
            if name is not None:
                self.jobs.after_bubble(name, out)
                if name not in self.jobs.active:
                    self._next_poll = 0.0  # room for another job
        self.link.publish_floor(self.dispatcher.floor_s())  # the trainer announces no bubble shorter (if unset)

    def _between(self) -> None:
        """What no bubble fits, between them: due commits deferred for too long (:meth:`Dispatcher.commit_between`),
        the profile measurements (:meth:`Dispatcher.measure_between`); a profile complete now is taken in (its verdict
        included), a job whose workload raised fails."""
        try:
            self.dispatcher.commit_between()
            complete = self.dispatcher.measure_between()
        except JobError as exc:
            self.jobs.fail(exc.job, exc.reason)
            return
        for name in complete:
            if (a := self.jobs.active.get(name)) is not None:
                self.jobs.profiled(a)

    def _fill(
        self, bubble: Any, deadline_ns: int, offered_s: float, *, exclude: str | None = None
    ) -> tuple[str | None, str, BubbleOutcome, int | None]:
        """The dispatcher's steps in ``bubble``; a job whose workload raised fails, a superseded slice stops."""
        try:
            return self.dispatcher.fill(bubble, deadline_ns, offered_s, exclude=exclude)
        except JobError as exc:  # the workload raised: that job fails, the executor and other jobs go on
            self.jobs.fail(exc.job, exc.reason)
            return exc.job, "error", BubbleOutcome(stop="error"), None
        except Superseded as exc:  # a commit was refused: the slice moved; stop it, nothing written
            self.jobs.superseded(exc.job, exc)
            return exc.job, "superseded", BubbleOutcome(stop="superseded"), None

    def _hand_off(self, job: str | None, out: BubbleOutcome, bubble: Any, deadline_ns: int) -> bool:
        """Whether the rest of ``bubble`` goes to another job: ``job``'s slice ran out of work in it (issue #30: a
        queue of small jobs switches mid-bubble instead of leaving the rest of it unused) or ``job`` is being profiled
        with nothing measured yet and its next measurement does not fit (issue #25), another active job has work or a
        last commit due, and at least :data:`HANDOFF_MIN_S` is left before the deadline."""
        if job is None or out.stop not in ("done", "profiling") or not self.link.is_open(bubble.id):
            return False
        if deadline_ns - time.monotonic_ns() < HANDOFF_MIN_S * 1e9:
            return False
        return any(n != job and (not a.task.done() or a.task.commit_due()) for n, a in self.jobs.active.items())
