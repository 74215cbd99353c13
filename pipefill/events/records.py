"""The event log's records: one frozen dataclass per event, shared by the trainer, the fill executor and every reader.

Every record carries the writer's two clocks, stamped when it is written: ``wall_s`` (``time.time()``: comparable
across nodes) and ``mono_ns`` (``time.monotonic_ns()``: the clock of every ``*_ns`` field, good for durations and for
lining up the processes of one machine). :meth:`Event.wall_of` puts any ``*_ns`` field of a record on the wall clock.
The format (one JSON object per line, ``event`` naming the record) is documented in ``docs/events.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "EVENT_TYPES",
    "ActionEvent",
    "AssignEvent",
    "BubbleEvent",
    "CommitEvent",
    "Event",
    "ExitEvent",
    "FillEvent",
    "HoldEvent",
    "JobEvent",
    "MeasureEvent",
    "ProfileEvent",
    "RestartEvent",
    "SliceEvent",
    "StartEvent",
    "StartupEvent",
    "StepEvent",
    "WorkEvent",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """The stamp every record carries; set by :class:`~pipefill.events.log.EventWriter` when it writes the record."""

    EVENT: ClassVar[str] = ""
    wall_s: float = 0.0
    """wall-clock seconds (Unix time) when the record was written"""
    mono_ns: int = 0
    """CLOCK_MONOTONIC ns at the same moment"""
    pid: int = 0
    """the writing process"""

    def wall_of(self, t_ns: int) -> float:
        """A ``*_ns`` time of this record (same process, monotonic clock) as wall-clock seconds."""
        return self.wall_s + (t_ns - self.mono_ns) / 1e9


# --- the trainer ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class StepEvent(Event):
    """One optimizer step of a rank."""

    EVENT = "step"
    step: int
    loss: float
    """mean over the global batch"""
    step_s: float
    """wall seconds from the first action to the optimizer step"""
    tokens_per_s: float
    """of the whole job"""
    start_ns: int
    """when the step began"""
    hook_s: float | None = None
    """the bubble hook's own time in the step: its wrappers' bookkeeping, not the calls they wrap (None: not the
    hook)"""
    hook_wait_s: float | None = None
    """the hook's bookkeeping of the step before (its records and metrics) that it did inside this step's waits,
    where the rank idles anyway: not part of ``hook_s`` (None: not the hook)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class ActionEvent(Event):
    """The compute span of action ``idx`` of the rank's order (torch spelling ``<stage><kind><mb>``)."""

    EVENT = "action"
    step: int
    idx: int
    action: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True, kw_only=True, slots=True)
class BubbleEvent(Event):
    """A wait of the trainer: ``idx`` is the action it precedes (``len(actions)``: the end of the step)."""

    EVENT = "bubble"
    step: int
    idx: int
    kind: str
    """warm-up, steady, cool-down or end-of-step"""
    start_ns: int
    end_ns: int
    predicted_s: float
    """the prediction at that moment"""
    announced: bool
    """offered on the bubble channel"""
    late: bool = False
    """announced only once the wait outlasted the late threshold (``PIPEFILL_TRAINER_LATE_ANNOUNCE_US``)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class RestartEvent(Event):
    """The trainer resumed from a checkpoint (a restarted job, or a new generation of its gang)."""

    EVENT = "restart"
    step: int
    """the step it continues from"""
    checkpoint: str
    """the checkpoint directory"""


# --- the fill executor ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class StartEvent(Event):
    """The fill executor attached and is set up."""

    EVENT = "start"
    device: str
    cpus: Sequence[int] | None = None
    cpu_priority: str | None = None  # "idle" (SCHED_IDLE: only CPU time its trainer leaves) or "normal"
    memory_budget_bytes: int
    memory_fraction: float | None = None
    guard_s: float
    training_job: str
    rank: int


@dataclass(frozen=True, kw_only=True, slots=True)
class JobEvent(Event):
    """A fill job changed phase on this executor (Running, Succeeded, Failed, Queued)."""

    EVENT = "job"
    job: str
    phase: str
    committed: int | None = None
    total: int | None = None
    message: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class SliceEvent(Event):
    """A slice of a fill job was claimed or finished; ``position`` is its commit pointer."""

    EVENT = "slice"
    job: str
    start: int
    end: int
    phase: str
    """claimed, done, superseded (it moved to another executor) or busy (its commit lock was held past the time
    limit: not opened now)"""
    position: int
    adopted: int | None = None
    """commits the recovery adopted"""
    removed: int | None = None
    """files the recovery removed"""


@dataclass(frozen=True, kw_only=True, slots=True)
class StartupEvent(Event):
    """A slice's start-up, between bubbles and before its first: claim, recovery, the workload's setup (model build,
    weights, dataset), then the first call of each batch size it will run (outputs dropped, state restored)."""

    EVENT = "startup"
    job: str
    slice: Sequence[int]
    start_ns: int
    end_ns: int
    open_s: float
    """claim, recovery and the workload's setup"""
    warm_s: float
    """the first calls"""
    batch_sizes: Sequence[int] = ()
    """the batch sizes called once (a size that ran out of memory or took over a second ends the list)"""
    warm_before: Sequence[int] = ()
    """the batch sizes the slice will run that this executor called before, for an earlier slice or job of the same
    workload on the same device: not called again (their one-off costs are the process's)"""
    reused: bool = False
    """the workload took what it could of the executor's last instance of the same workload (its ``reuse`` hook)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileEvent(Event):
    """A fill job's profile (step time and peak memory per batch size) is complete."""

    EVENT = "profile"
    job: str
    cached: bool
    device: str
    points: Sequence[Mapping[str, Any]]
    """``batch_size``, ``step_s``, ``peak_bytes`` each"""
    batch_size: int | None = None
    """the one the naive runner runs (benchmark only)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasureEvent(Event):
    """A profile's measurement taken between bubbles, not in one: the first batch size of a job, nothing measured yet,
    whose next measurement no bubble fitted (or nothing predicted it)."""

    EVENT = "measure"
    job: str
    batch_size: int
    start_ns: int
    end_ns: int
    step_s: float
    """the measured step's cost (on a CPU at idle priority this thread's CPU time, else wall time)"""
    items: int = 0
    """units of work it did: an inference job's measured steps are its work (0: a training job's, undone after)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class AssignEvent(Event):
    """Which job each bubble class goes to."""

    EVENT = "assign"
    classes: Mapping[str, str | None]
    """class length (``"12.500ms"``) → job"""
    jobs: Sequence[str]


@dataclass(frozen=True, kw_only=True, slots=True)
class FillEvent(Event):
    """One announced bubble as the fill executor saw and used it."""

    EVENT = "fill"
    id: int
    kind: str
    open_ns: int
    expected_end_ns: int
    woke_ns: int
    yielded_ns: int
    free_bytes: int | None = None
    job: str | None = None
    batch_size: int | None = None
    """the largest batch size the bubble's steps could use (the job's most efficient one that fits the memory);
    None while the job is being profiled and did no work in the bubble"""
    steps: int
    items: int
    used_s: float
    overrun_s: float
    """how long after the expected end it yielded (0 when no step ran)"""
    overrun_cause: str | None = None
    """past the guard only: what held the device longest past the expected end — step, start-up (a profiling step
    or a batch size's first call), commit (its device part), transfer (offload), yield (none of them), preempted (a
    step the trainer preempted on its core after the bubble closed: the fill held nothing)"""
    margin_s: float = 0.0
    """the extra margin the job's steps were planned with (learnt from its overruns; 0: the guard only)"""
    closed_ns: int = 0
    """when the trainer closed the bubble (its wait ended: it wants the device back), as the fill read it right after
    it yielded; 0: the bubble was still open then (or no step ran)"""
    trainer_wait_s: float = 0.0
    """how long the trainer, back from the bubble, waited for the fill: from the close to the end of the fill's last
    work on the device (a step, a commit's device part, a transfer; its host code after that holds no device); 0 when
    the bubble was still open at the yield (however late past its expected end: the trainer was idle anyway), or when
    the trainer took its core back from the fill (``preempted``: it held nothing)"""
    commit_s: float = 0.0
    stop: str | None = None
    """why the last step was not started: time, closed, done, profiling, idle, short, memory, error"""
    spans_ns: Sequence[Sequence[int]] = ()
    """[start, end] of every step"""
    step: int | None = None
    """the training step the bubble belongs to (as announced)"""
    batch_sizes: Sequence[int] = ()
    """the batch size of every step (the last ones sized to the time left); 0: a profiling step that did no work (a
    training job's, undone after; an inference job's measured steps are its work)"""
    commits_ns: Sequence[Sequence[int]] = ()
    """[start, end] of every commit made in the bubble"""
    deadline_ns: int | None = None
    """the time the fill planned to have finished its steps by: the planned end of the bubble minus the guard"""
    handoff: str | None = None
    """the job that got the rest of the bubble when ``job``'s slice ran out of work in it (its steps are among
    ``spans_ns``, after ``job``'s; ``handoff_items`` of ``items`` are its)"""
    handoff_items: int = 0
    span_kinds: str = ""
    """one letter per span of ``spans_ns``: ``w`` a whole step, ``p`` a piece of a batch (partial steps), ``c`` a piece
    of a batch an earlier bubble left in flight, ``x`` a piece run past the planned end while the channel said the
    bubble was open (the continuation), ``m`` a profiling measurement"""
    step_trace: Sequence[Sequence[int]] = ()
    """where each step's time went, one row per span of ``spans_ns``: [host µs (its call until it returned, before the
    device was synchronized), the filling thread's CPU µs, its voluntary and involuntary context switches]
    (``pipefill_fill.steptrace``)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class HoldEvent(Event):
    """The fill executor was told to idle (``held``) or to work again: a ``fill.hold`` file in the channel directory
    appeared or went away. While held it takes no bubble; the trainer announces as always (benchmark blocks A/B)."""

    EVENT = "hold"
    held: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class CommitEvent(Event):
    """Fill progress made durable: ``end`` is the job's committed units over all slices."""

    EVENT = "commit"
    job: str
    end: int
    slice: Sequence[int] | None = None
    position: int | None = None
    bytes: int
    commit_s: float
    """its device part (state to the host, outputs and state to bytes), made inside a bubble, or between bubbles
    (``at``: ``between``) when it fit none"""
    write_s: float = 0.0
    """its file part (write, fsync, rename), made off the filling thread, which it waits for while a bubble is filled"""
    at: str | None = None
    """``shutdown`` for the final commit; ``between``: its device part fit no bubble's start for ``DEFER_BUBBLES`` bubbles
    or ``DEFER_S`` and was made between bubbles"""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkEvent(Event):
    """Naive co-location (benchmark): steps run back to back in ``[start_ns, end_ns)``, bubbles ignored."""

    EVENT = "work"
    job: str
    start_ns: int
    end_ns: int
    steps: int
    items: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ExitEvent(Event):
    """The fill executor stops (trainer gone, SIGTERM)."""

    EVENT = "exit"
    reason: str


EVENT_TYPES: dict[str, type[Event]] = {
    cls.EVENT: cls
    for cls in (
        StepEvent,
        ActionEvent,
        BubbleEvent,
        RestartEvent,
        StartEvent,
        JobEvent,
        StartupEvent,
        SliceEvent,
        ProfileEvent,
        MeasureEvent,
        AssignEvent,
        FillEvent,
        HoldEvent,
        CommitEvent,
        WorkEvent,
        ExitEvent,
    )
}
"""event name → record class"""
