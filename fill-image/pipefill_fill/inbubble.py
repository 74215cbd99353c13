"""The hot path: run one fill job's steps inside one bubble and yield before its expected end.

Rules (docs/fill.md, "Guarantees"):

* a step starts only while the bubble is open and when ``now + predicted_step ≤ expected_end − guard``;
* the device is synchronized after every step, so a step's end is when the device is free again;
* a commit (chunk or checkpoint) that is due has its device part (:meth:`FillTask.stage_commit`: state to the host,
  outputs and state to bytes) made inside a bubble where its predicted time fits: at the bubble's start (steps fill
  bubbles to their end, so a commit left for the end would rarely fit), or after the last step when time is left —
  the last commit of a slice too, which otherwise waits for the next bubble where it fits (the end-of-step bubble is
  usually the longest). Its file part (write, fsync, rename) is the commit writer's, off this thread
  (:mod:`pipefill_fill.commits`). A commit that fit no bubble's start for :data:`DEFER_BUBBLES` bubbles in a row, or
  for :data:`DEFER_S`, has its device part made between bubbles (:func:`commit_between`): work must become durable,
  and no bubble is held past its end for it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from pipefill_fill.commits import Pending
from pipefill_fill.device import device_sync
from pipefill_fill.inpieces import Next, PieceCosts, continue_work, next_work
from pipefill_fill.offload import Offloader
from pipefill_fill.predict import INTERRUPTED, OVERRUN_BUDGET_S, Estimator, StepModel
from pipefill_fill.steptrace import StepTrace, mark
from pipefill_fill.task import FillTask

__all__ = [
    "DEFER_BUBBLES",
    "DEFER_S",
    "BubbleOutcome",
    "OpenBubble",
    "commit_between",
    "defer_commit",
    "fits",
    "run_steps",
]

DEFER_BUBBLES = 64
"""Bubbles in a row a due commit may wait for one whose start fits its device part; then that part is made between
bubbles (:func:`commit_between`), not at a bubble's start anyway, overrunning it by what it does not fit."""
DEFER_S = 1.0
"""And at most this long: where bubbles are few (a rank with one or two a step, steps of a second) or their planned
ends fall at their starts (a loaded machine), 64 of them are a minute, for which a finished slice would hold its
job's completion and, meanwhile, its seat."""


class OpenBubble(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def open_ns(self) -> int: ...

    @property
    def expected_end_ns(self) -> int: ...


@dataclass
class BubbleOutcome:
    """What happened in one bubble; times are CLOCK_MONOTONIC ns."""

    steps: int = 0
    items: int = 0
    busy_ns: int = 0
    commit_ns: int = 0
    """the commits' device part (their file part is written off the filling thread)"""
    transfer_ns: int = 0
    committed_bytes: int = 0
    spans_ns: list[tuple[int, int]] = field(default_factory=list)
    traces: list[StepTrace] = field(default_factory=list)
    """where each step's time went (:mod:`pipefill_fill.steptrace`), one per span of ``spans_ns``"""
    batch_sizes: list[int] = field(default_factory=list)
    """the batch size of every step"""
    commits_ns: list[tuple[int, int]] = field(default_factory=list)
    """[start, end] of every commit made in the bubble"""
    transfers_ns: list[tuple[int, int]] = field(default_factory=list)
    """[start, end] of offload mode's copies to and from the device"""
    startup_steps: set[int] = field(default_factory=set)
    """indices (in ``spans_ns``) of first calls: profiling steps, a batch size the slice had not run yet"""
    interrupted: set[int] = field(default_factory=set)
    """indices (in ``spans_ns``) of steps that cost, or lasted, more than :data:`pipefill_fill.predict.INTERRUPTED`
    times their base: the machine took the core (a VM's host, another process, the trainer preempting an executor at
    idle priority), nothing the step itself does"""
    kinds: list[str] = field(default_factory=list)
    """what each span was (the ``fill`` record's ``span_kinds``): w a whole step, p a piece, c a piece of a batch an
    earlier bubble left in flight, x a piece past the planned end (continuation), m a profiling measurement"""
    pieces: int = 0
    """steps that were pieces of a batch (partial steps, :mod:`pipefill_fill.pieces`)"""
    continued: int = 0
    """pieces run after the planned end while the bubble was still open (the last ones of ``spans_ns``)"""
    margin_ns: int = 0
    """the extra margin the steps were planned with (:class:`pipefill_fill.overruns.Margin`)"""
    stop: str = ""  # why the last step was not started: time, closed, done, error

    def extend(self, other: BubbleOutcome) -> None:
        """Add ``other`` (the steps of the job the rest of the bubble was handed to) after these."""
        self.startup_steps |= {len(self.spans_ns) + i for i in other.startup_steps}
        self.interrupted |= {len(self.spans_ns) + i for i in other.interrupted}
        self.steps += other.steps
        self.kinds += other.kinds
        self.pieces += other.pieces
        self.continued += other.continued
        self.items += other.items
        self.busy_ns += other.busy_ns
        self.commit_ns += other.commit_ns
        self.transfer_ns += other.transfer_ns
        self.committed_bytes += other.committed_bytes
        self.spans_ns += other.spans_ns
        self.traces += other.traces
        self.batch_sizes += other.batch_sizes
        self.commits_ns += other.commits_ns
        self.transfers_ns += other.transfers_ns
        self.margin_ns = max(self.margin_ns, other.margin_ns)
        self.stop = other.stop

    @property
    def first_start_ns(self) -> int | None:
        return self.spans_ns[0][0] if self.spans_ns else None

    @property
    def last_end_ns(self) -> int | None:
        return self.spans_ns[-1][1] if self.spans_ns else None


def run_steps(
    bubble: OpenBubble,
    *,
    task: FillTask,
    max_batch: int,
    model: StepModel,
    commit_estimate: Estimator,
    is_open: Callable[[int], bool],
    deadline_ns: int,
    device: torch.device,
    kind: str = "",
    any_size: bool = True,
    budget_s: float = OVERRUN_BUDGET_S,
    offloader: Offloader | None = None,
    transfer_estimate: Estimator | None = None,
    clock: Callable[[], int] = time.monotonic_ns,
    cost_clock: Callable[[], int] | None = None,  # what a step costs, for the model (None: ``clock``)
    pieces: PieceCosts | None = None,  # the job's piece costs: its steps may run in pieces (issue #25)
    continue_piece_s: float = 0.0,  # pieces past the planned end while the bubble is open, none longer (0: never)
    split_above_s: float = 0.0,  # a whole step predicted longer runs in pieces, each checked against the time left
) -> BubbleOutcome:
    """Steps of ``task`` until the next would not finish by ``deadline_ns`` (expected end − guard).

    Each step runs the largest batch (≤ ``max_batch``) whose predicted time (:class:`StepModel`, at its high
    quantile for bubbles of ``kind``) fits the time left, so the last steps of a bubble are sized to its tail:
    any size with ``any_size`` (inference), else the profiled sizes only. With ``pieces`` (a workload with partial
    steps), the batch in flight goes on piece by piece first, a bubble too short for a whole batch starts one in
    pieces, and so does a whole step predicted longer than ``split_above_s`` (:func:`pipefill_fill.inpieces.next_work`).
    """
    out = BubbleOutcome()
    moving = offloader is not None and offloader.enabled
    transfer_s = transfer_estimate.predict_s() if (moving and transfer_estimate is not None) else 0.0
    if moving:
        if model.largest_fitting((deadline_ns - clock()) / 1e9 - 2 * transfer_s, max_batch, kind) is None:
            out.stop = "time"
            return out
        t = clock()
        offloader.to_device()  # type: ignore[union-attr]
        out.transfers_ns.append((t, clock()))
        out.transfer_ns += out.transfers_ns[-1][1] - t
    if task.commit_due() and is_open(bubble.id):  # what earlier bubbles did, before steps fill this one to its end
        if fits(clock, commit_estimate.predict_s() + transfer_s, deadline_ns):
            _commit(task, out, commit_estimate, clock)
        else:
            defer_commit(task, clock)
    run = functools.partial(
        _run, task, out=out, model=model, kind=kind, device=device, clock=clock, cost_clock=cost_clock, costs=pieces
    )
    while True:
        if task.done():
            out.stop = "done"
            break
        start = clock()
        left_s = (deadline_ns - start) / 1e9 - transfer_s
        nxt = next_work(
            task,
            model,
            pieces,
            left_s=left_s,
            class_s=(deadline_ns - bubble.open_ns) / 1e9 - 2 * transfer_s,
            max_batch=max_batch,
            kind=kind,
            any_size=any_size,
            budget_s=budget_s,
            fresh=not out.steps,
            split_above_s=split_above_s,
        )
        if nxt is None:
            out.stop = "time"
            break
        if not is_open(bubble.id):
            out.stop = "closed"
            break
        if run(nxt, start=start):
            out.stop = "done"
            break
    # the trainer still idle at the planned end (issue #25 item 3): pieces while the channel says the bubble is open,
    # none predicted longer than continue_piece_s, so the trainer's resume waits at most one such piece
    while out.stop == "time" and continue_piece_s > 0 and pieces and not moving and not task.done():
        nxt = continue_work(task, model, pieces, max_piece_s=continue_piece_s, max_batch=max_batch, kind=kind)
        start = clock()
        if nxt is None or not is_open(bubble.id):
            break
        out.continued += 1
        if run(nxt, start=start, continued=True):
            out.stop = "done"
    # the last one of a slice too (else the next bubble's start), but only while the bubble is open: a trainer back
    # before the expected end would wait for the commit's device part (a session-29 test found 8 ms waits)
    if task.commit_due() and fits(clock, commit_estimate.predict_s() + transfer_s, deadline_ns) and is_open(bubble.id):
        _commit(task, out, commit_estimate, clock)
    if moving:
        t = clock()
        offloader.to_host()  # type: ignore[union-attr]
        out.transfers_ns.append((t, clock()))
        out.transfer_ns += out.transfers_ns[-1][1] - t
        if transfer_estimate is not None:
            transfer_estimate.record(out.transfer_ns / 2e9)
    return out


def _run(
    task: FillTask,
    nxt: Next,
    *,
    out: BubbleOutcome,
    model: StepModel,
    kind: str,
    device: torch.device,
    clock: Callable[[], int],
    cost_clock: Callable[[], int] | None,
    start: int,
    costs: PieceCosts | None = None,
    continued: bool = False,
) -> bool:
    """Run ``nxt`` (a step, or a piece), synchronize, account for it in ``out``, the model and (a piece) ``costs``;
    whether the slice has no work left."""
    batch_size = nxt.batch_size
    # a piece of the batch in flight when the bubble began, until it completes: the carry-over
    before = task.in_flight() if nxt.piece else None
    index = before.done if before is not None else 0  # the piece's index: the flight's count moves on in place
    carried = before is not None and (not out.kinds or out.kinds[-1] == "c")
    cost0 = cost_clock() if cost_clock is not None else start
    base_s = model.base_s(batch_size) * nxt.share  # before the step: what the model expected of it
    before_mark = mark()
    items = task.step_piece(batch_size) if nxt.piece else task.step(batch_size)
    launched = clock()
    device_sync(device)
    end = clock()
    out.traces.append(StepTrace.between(before_mark, mark(), host_ns=launched - start))
    cost_s = ((cost_clock() if cost_clock is not None else end) - cost0) / 1e9
    model.record(batch_size, cost_s / nxt.share, kind)  # a piece: as the step it is that share of
    if costs is not None and nxt.piece and (flight := before or task.in_flight()) is not None:
        costs.observe(flight.batch_size, index, flight.pieces, cost_s)
    if task.first_call:
        out.startup_steps.add(len(out.spans_ns))
    elif max(cost_s, (end - start) / 1e9) > INTERRUPTED * base_s:
        # by the wall clock too: on a CPU at idle priority the cost is the thread's CPU time, and a step the trainer
        # preempted ends late at its usual cost; it held nothing meanwhile, and its late end must not set the job's
        # learnt margin (make demo: three such steps 10-20 ms late planned every bubble for 27 steps at half length)
        out.interrupted.add(len(out.spans_ns))
    out.spans_ns.append((start, end))
    out.batch_sizes.append(batch_size)
    out.steps += 1
    out.pieces += nxt.piece
    out.kinds.append("x" if continued else "c" if carried else "p" if nxt.piece else "w")
    out.items += items
    out.busy_ns += end - start
    return items <= 0 and task.in_flight() is None


def commit_between(
    task: FillTask,
    commit_estimate: Estimator,
    *,
    clock: Callable[[], int] = time.monotonic_ns,
    cost_clock: Callable[[], int],
) -> tuple[int, int] | None:
    """Between bubbles: the device part of ``task``'s due commit that fit no bubble's start for :data:`DEFER_BUBBLES`
    bubbles in a row or for :data:`DEFER_S` (its file part goes to the writer as any commit's). Its cost, by
    ``cost_clock`` (the step clock: on a CPU at idle priority the thread's CPU time, which the trainer's work meanwhile
    does not inflate), teaches the commit's estimate. Returns its [start, end] (``clock``), or None: nothing due."""
    if not (task.commit_due() and _deferred_enough(task, clock)):
        return None
    start, end, pending = _stage(task, commit_estimate, clock, cost_clock)
    if pending is not None:
        pending.between = True
    return start, end


def defer_commit(task: FillTask, clock: Callable[[], int] = time.monotonic_ns) -> None:
    """``task``'s due commit fitted no time left at a bubble's start: counted towards :func:`commit_between`."""
    if task.deferred == 0:
        task.deferred_since_ns = clock()
    task.deferred += 1


def _deferred_enough(task: FillTask, clock: Callable[[], int]) -> bool:
    """Whether a due commit has waited long enough for a bubble that fits it: :data:`DEFER_BUBBLES` or
    :data:`DEFER_S`."""
    return task.deferred >= DEFER_BUBBLES or (task.deferred > 0 and clock() - task.deferred_since_ns >= DEFER_S * 1e9)


def fits(clock: Callable[[], int], duration_s: float, deadline_ns: int) -> bool:
    """Whether work of ``duration_s`` started now (``clock``) ends by ``deadline_ns``."""
    return clock() + int(1e9 * duration_s) <= deadline_ns


def _stage(
    task: FillTask, commit_estimate: Estimator, clock: Callable[[], int], cost_clock: Callable[[], int]
) -> tuple[int, int, Pending | None]:
    """A commit's device part (the file part is the writer's), its cost by ``cost_clock`` taught to the estimate:
    [start, end] by ``clock``, and the commit in flight (None: nothing new). The deferral count starts over."""
    start, cost0 = clock(), cost_clock()
    pending = task.stage_commit(clock)
    task.deferred = 0
    end = clock()
    commit_estimate.record((cost_clock() - cost0) / 1e9)
    return start, end, pending


def _commit(task: FillTask, out: BubbleOutcome, commit_estimate: Estimator, clock: Callable[[], int]) -> None:
    """A commit's device part in a bubble, accounted in ``out``."""
    start, end, pending = _stage(task, commit_estimate, clock, clock)
    out.committed_bytes += pending.staged.nbytes if pending is not None else 0
    out.commits_ns.append((start, end))
    out.commit_ns += end - start
