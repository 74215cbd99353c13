"""``FillJob.status``: what the operator's queue and the fill executors write about a FillJob.

Two writers share it, each field (or sub-field, or value) with exactly one of them, as :data:`STATUS_WRITERS` says
(docs/fill.md, "Who writes what"): the queue (the scheduling pass's outcome, which the operator's fill loop or
``pipefill local`` writes) owns the plan of record, the assignments, the phase until a verdict, the progress it derives
from the commit pointers and the ``Scheduled`` condition; the executors advance each slice's ``committed`` pointer
(never backwards), report their rank's ``unfit`` and ``bubbleClasses`` entries, the ``profile`` and the throughput,
and give the final verdict. Both write with a precondition (resourceVersion, or the status file unchanged under its
lock), so neither overwrites the other. The shapes mirror the queue's :mod:`pipefill.queue.snapshot` values, which
the operator builds from them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from pipefill.spec._schema import Rule, field
from pipefill.spec.common import Condition

__all__ = [
    "MAX_ASSIGNMENTS",
    "MAX_MESSAGE_CHARS",
    "MAX_SLICES",
    "STATUS_WRITERS",
    "Assignment",
    "BubbleClassReport",
    "FillJobPhase",
    "FillJobStatus",
    "OutputReport",
    "ProfileEntry",
    "RankBubbles",
    "SliceProgress",
    "StatusWriter",
    "UnfitReason",
    "UnfitReport",
    "Writer",
]

MAX_SLICES = 4096
"""Slices in one plan of record at most (``pipefill.queue.plan_slices`` never plans more): bounds the status size."""
MAX_ASSIGNMENTS = 4096
MAX_MESSAGE_CHARS = 4096
_MAX_RANK_REPORTS = 1024
"""unfit and bubbleClasses entries at most: one per (training job, rank) that worked on the job."""
_NAME = 253  # object names
_UID = 64  # a pod's metadata.uid (a UUID, 36 characters)


class FillJobPhase(enum.StrEnum):
    QUEUED = "Queued"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


@dataclass
class Assignment:
    """A slice of the job given to one rank pod (operator-owned). The executor of ``podUID`` may run and commit the
    slice only while this entry, with this ``epoch``, is in the status: it re-checks at every commit."""

    training_job: str = field(doc="PipelineTrainingJob name.", max_length=_NAME)
    rank: int = field(doc="Pipeline rank (pod) doing the work.", minimum=0)
    start: int = field(doc="First sample (or step) of the slice.", minimum=0)
    end: int = field(doc="One past the last sample (or step) of the slice.", minimum=0)
    pod: str | None = field(doc="The rank pod's name (set by the operator).", max_length=_NAME, default=None)
    pod_uid: str | None = field(
        doc="The rank pod's metadata.uid (a restarted gang reuses pod names, never uids); the executor compares it "
        "with PIPEFILL_POD_UID.",
        name="podUID",
        max_length=_UID,
        default=None,
    )
    epoch: int | None = field(
        doc="Placement number of this slice (set by the operator): grows with every placement of the job; a commit "
        "of an older epoch is refused.",
        minimum=0,
        default=None,
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(rule="self.start < self.end", message="an assignment needs start < end", field_path=".end"),
    )


@dataclass
class SliceProgress:
    """One slice of the plan of record; ``[start, committed)`` is done (committed == end: the slice is done)."""

    start: int = field(doc="First sample (or step) of the slice.", minimum=0)
    end: int = field(doc="One past the last sample (or step).", minimum=1)
    committed: int = field(
        doc="Commit pointer: samples before it are durably written. Executors only advance it.", minimum=0
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="self.start < self.end && self.start <= self.committed && self.committed <= self.end",
            message="a slice needs start < end and start ≤ committed ≤ end",
            message_expression="'slice [%d, %d): committed %d must lie within the slice (start ≤ committed ≤ end)'"
            ".format([self.start, self.end, self.committed])",
            field_path=".committed",
        ),
    )


class UnfitReason(enum.StrEnum):
    BUBBLE_TOO_SHORT = "BubbleTooShort"
    NOT_ENOUGH_MEMORY = "NotEnoughMemory"


@dataclass
class UnfitReport:
    """An executor's report that the job fits none of its rank's bubbles; it let go of the job (executor-written).
    The operator places the job elsewhere and removes the entry once no assignment holds that rank."""

    training_job: str = field(doc="PipelineTrainingJob of the rank.", max_length=_NAME)
    rank: int = field(doc="The rank whose bubbles do not fit.", minimum=0)
    reason: UnfitReason = field(doc="BubbleTooShort (no bubble long enough) or NotEnoughMemory.")
    message: str = field(doc="The executor's words, with the numbers.", max_length=1024, default="")
    longest_bubble_milliseconds: float | None = field(
        doc="The rank's longest usable bubble (after the guard).", unit="ms", minimum=0, default=None
    )
    step_milliseconds: float | None = field(
        doc="The job's shortest step (smallest batch) as measured or estimated.", unit="ms", minimum=0, default=None
    )
    free_bytes: int | None = field(doc="Device memory the rank's fill may use, bytes.", minimum=0, default=None)
    peak_memory_bytes: int | None = field(
        doc="The job's peak device memory at its smallest batch, bytes.", minimum=0, default=None
    )


@dataclass
class ProfileEntry:
    """One measured batch size of the job (executor-written): what sjf and makespan plan with."""

    batch_size: int = field(doc="Samples per step.", minimum=1)
    step_milliseconds: float = field(doc="Median step time.", unit="ms", minimum=0, exclusive_minimum=True)
    peak_memory_bytes: int = field(doc="Peak device memory of one step, bytes.", minimum=0)


@dataclass
class BubbleClassReport:
    """Bubbles of one kind on one rank: expected length, device memory free for fill, how many per training step."""

    duration_milliseconds: float = field(doc="Expected usable length.", unit="ms", minimum=0)
    per_step: float = field(doc="Bubbles of this class per training step.", minimum=0, exclusive_minimum=True)
    free_bytes: int = field(doc="Device memory the fill may use in it, bytes.", minimum=0)


@dataclass
class RankBubbles:
    """The bubble classes one rank's executor measured (executor-written); ranks not listed are predicted."""

    training_job: str = field(doc="PipelineTrainingJob of the rank.", max_length=_NAME)
    rank: int = field(doc="The rank.", minimum=0)
    classes: list[BubbleClassReport] = field(doc="Its bubble classes.", max_items=32, default_factory=list)
    step_milliseconds: float | None = field(
        doc="The training step time the rank measured.", unit="ms", minimum=0, exclusive_minimum=True, default=None
    )


@dataclass
class OutputReport:
    """Where the job's results are: its output directory, on which claim, and what to read there once Succeeded."""

    path: str = field(
        doc="The job's output directory (spec.output.path; on the claim, relative to its root).", max_length=4096
    )
    claim_name: str | None = field(
        doc="The PersistentVolumeClaim (the training jobs' fill storage) it is on; absent in local runs.",
        max_length=_NAME,
        default=None,
    )
    files: list[str] = field(
        doc="What to read in it once the job Succeeded: outputs.npy (inference: one row per sample, in sample "
        "order); empty for training, whose workload writes its checkpoints and final model there.",
        max_items=8,
        default_factory=list,
    )


@dataclass
class FillJobStatus:
    """Observed state, written by the operator (plan, assignments, phase) and the executors (commit pointers,
    reports), or by `pipefill local`."""

    phase: FillJobPhase = field(doc="Queued, Running, Succeeded, Failed or Cancelled.", default=FillJobPhase.QUEUED)
    message: str = field(doc="Why the job is in its phase, in words.", max_length=MAX_MESSAGE_CHARS, default="")
    conditions: list[Condition] = field(
        doc="Standard conditions; the operator's Scheduled condition says why a job waits.",
        max_items=16,
        default_factory=list,
    )
    slices: list[SliceProgress] = field(
        doc="The plan of record, written once by the operator when the job is first scheduled; executors advance "
        "committed.",
        max_items=MAX_SLICES,
        default_factory=list,
    )
    assignments: list[Assignment] = field(
        doc="Where the work runs now.", max_items=MAX_ASSIGNMENTS, default_factory=list
    )
    epoch: int = field(doc="The highest placement epoch handed out so far.", minimum=0, default=0)
    output: OutputReport | None = field(
        doc="Where the results are (written with the plan; docs/fill.md says how to read them).", default=None
    )
    unfit: list[UnfitReport] = field(
        doc="Ranks whose bubbles the job does not fit.", max_items=_MAX_RANK_REPORTS, default_factory=list
    )
    profile: list[ProfileEntry] = field(doc="The job's measured profile.", max_items=32, default_factory=list)
    bubble_classes: list[RankBubbles] = field(
        doc="Bubble classes per rank, as the executors there measured them.",
        max_items=_MAX_RANK_REPORTS,
        default_factory=list,
    )
    samples_done: int = field(doc="Committed samples (or steps).", minimum=0, default=0)
    progress: float = field(doc="samplesDone ÷ total, in percent.", minimum=0, maximum=100, default=0.0)
    throughput: float | None = field(
        doc="Committed samples (or steps) per second, recent average.", unit="1/s", minimum=0, default=None
    )
    estimated_completion_time: str | None = field(
        doc="When the job will finish at the current throughput.", fmt="date-time", default=None
    )
    start_time: str | None = field(doc="When work first started.", fmt="date-time", default=None)
    completion_time: str | None = field(doc="When the job finished.", fmt="date-time", default=None)


class Writer(enum.StrEnum):
    """Who writes a part of FillJob status. The operator writes FillJob status only through its queue."""

    QUEUE = "queue"
    """the scheduling pass's outcome (:mod:`pipefill.queue.outcome`): the operator's fill loop, or ``pipefill local``"""
    EXECUTOR = "executor"
    """a fill executor's report (:func:`pipefill.queue.status.executor_patch`)"""


_VERDICTS = frozenset({FillJobPhase.SUCCEEDED.value, FillJobPhase.FAILED.value})
_QUEUE_PHASES = frozenset({FillJobPhase.QUEUED.value, FillJobPhase.RUNNING.value, FillJobPhase.CANCELLED.value})


@dataclass(frozen=True)
class StatusWriter:
    """One row of the ownership table: ``path`` (a camelCase status field, ``list[].field`` a sub-field of every entry
    of a list, ``list[]`` its entries) is written by ``writer``; ``phases``, when given, limits it to a patch whose
    phase (the one it writes, else the status's) is one of them: the final verdict's writer writes the phase, the
    message and the completion time together."""

    path: str
    writer: Writer
    why: str
    phases: frozenset[str] = frozenset()


STATUS_WRITERS: tuple[StatusWriter, ...] = (
    StatusWriter("phase", Writer.QUEUE, "placements decide Queued and Running; spec.cancel Cancelled", _QUEUE_PHASES),
    StatusWriter(
        "phase", Writer.EXECUTOR, "the verdict: outputs assembled (Succeeded), or the workload raised", _VERDICTS
    ),
    StatusWriter(
        "message", Writer.QUEUE, "why the job waits or where it runs (the Scheduled condition's words)", _QUEUE_PHASES
    ),
    StatusWriter("message", Writer.EXECUTOR, "the verdict's words (the workload's error)", _VERDICTS),
    StatusWriter("completionTime", Writer.QUEUE, "when it was cancelled", _QUEUE_PHASES),
    StatusWriter("completionTime", Writer.EXECUTOR, "when the verdict was given", _VERDICTS),
    StatusWriter("conditions", Writer.QUEUE, "Scheduled: assigned, waiting (with the reason), completing, completed"),
    StatusWriter("slices[]", Writer.QUEUE, "the plan of record, written once"),
    StatusWriter("slices[].start", Writer.QUEUE, "the plan's bounds"),
    StatusWriter("slices[].end", Writer.QUEUE, "the plan's bounds"),
    StatusWriter("slices[].committed", Writer.EXECUTOR, "the commit pointer, as the slice's storage has it"),
    StatusWriter("output", Writer.QUEUE, "where the results are, written with the plan"),
    StatusWriter("assignments", Writer.QUEUE, "which rank pod runs which slice"),
    StatusWriter("epoch", Writer.QUEUE, "the highest placement epoch handed out"),
    StatusWriter("samplesDone", Writer.QUEUE, "the sum of the commit pointers"),
    StatusWriter("progress", Writer.QUEUE, "samplesDone in percent of the total"),
    StatusWriter("startTime", Writer.QUEUE, "when the job was first placed"),
    StatusWriter("unfit[]", Writer.EXECUTOR, "a rank's own entry: its executor let go of the job"),
    StatusWriter("unfit", Writer.QUEUE, "entries of training jobs that no longer run are removed"),
    StatusWriter("profile", Writer.EXECUTOR, "the job's measured batch sizes"),
    StatusWriter("bubbleClasses[]", Writer.EXECUTOR, "a rank's own entry: its measured bubble classes"),
    StatusWriter("throughput", Writer.EXECUTOR, "committed units per second as an executor saw them grow"),
    StatusWriter("estimatedCompletionTime", Writer.EXECUTOR, "from the throughput and the work left"),
)
"""Who writes every part of FillJob status: one writer per field, per sub-field where two share a list, per phase
where the phase tells who decided it. Enforced where patches are made (:func:`pipefill.queue.status.check_patch`)."""
