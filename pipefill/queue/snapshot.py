"""What one scheduling pass sees: every FillJob and every training job's rank pods, as plain typed values.

The operator builds a :class:`Snapshot` from the API objects it watches (FillJobs with their status, training jobs,
pods) and hands it to :func:`pipefill.queue.schedule_pass`; nothing here talks to a cluster, so the pass is a pure
function that tests and benchmarks drive directly. Status fields that the executors will own (slices with commit
pointers, unfit reports, the measured profile) mirror ``FillJob.status`` (:mod:`pipefill.spec.fillstatus`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipefill.plan import BubbleClass, ProfilePoint
from pipefill.queue.slices import MIN_SLICE_UNITS, Slice, check_plan
from pipefill.spec import FillJob, PipelineTrainingJob, PipelineTrainingJobSpec, parse_bytes
from pipefill.spec.common import LabelSelector, Location

__all__ = [
    "FillJobView",
    "Placement",
    "RankView",
    "SliceStatus",
    "Snapshot",
    "TrainingJobView",
    "Unfit",
    "selector_key",
]

_ACTIVE_PHASES = frozenset({"Queued", "Running"})


@dataclass(frozen=True)
class SliceStatus:
    """One slice of the plan of record and its commit pointer (``status.slices[]``): ``[start, committed)`` is done."""

    start: int
    end: int
    committed: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"a slice needs 0 ≤ start < end; got [{self.start}, {self.end})")
        if not self.start <= self.committed <= self.end:
            raise ValueError(
                f"slice [{self.start}, {self.end}): committed {self.committed} must lie within the slice "
                "(the executor's commit pointer)"
            )

    @property
    def slice(self) -> Slice:
        return Slice(self.start, self.end)

    @property
    def done(self) -> bool:
        return self.committed >= self.end

    @property
    def remaining(self) -> int:
        return self.end - self.committed


@dataclass(frozen=True)
class Unfit:
    """An executor's report that the job fits none of its bubbles (``status.unfit[]``); it let go of the job."""

    training_job: str
    rank: int
    reason: str = ""


@dataclass(frozen=True)
class Placement:
    """One slice of a FillJob given to one rank pod. ``epoch`` grows with every placement of the job; the executor
    commits only while its placement is the slice's current one, so a process that outlives its pod cannot commit
    into a slice that moved. ``pod_uid`` (not the name, which a restarted gang may reuse) says which pod it is."""

    fill_job: str
    start: int
    end: int
    training_job: str
    rank: int
    pod: str
    pod_uid: str
    epoch: int

    @property
    def slice(self) -> Slice:
        return Slice(self.start, self.end)


@dataclass(frozen=True)
class FillJobView:
    """A FillJob as the queue sees it: spec fields, and the status the executors and the operator wrote."""

    name: str
    total: int
    namespace: str = "default"
    created_unix_s: float = 0.0
    kind: str = "inference"
    phase: str = "Queued"
    priority: int = 0
    deadline_unix_s: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    host_selector: LabelSelector = field(default_factory=LabelSelector)
    max_parallel_ranks: int = 1
    min_slice_units: int = MIN_SLICE_UNITS
    """spec.minSliceSamples: the fewest units in one slice of the plan (:func:`pipefill.queue.plan_slices`)"""
    estimate_step_s: float | None = None
    """spec.estimates.stepMilliseconds in seconds: one step at the smallest batch (taken as one unit of work)"""
    estimate_peak_bytes: int | None = None
    profile: tuple[ProfilePoint, ...] = ()
    """measured: step time and peak memory per batch size (empty until an executor profiled the job)"""
    storage_claim: str | None = None
    """spec.output.claimName: only training jobs whose spec.fill.storage holds this claim (None: no storage) host it"""
    slices: tuple[SliceStatus, ...] = ()
    """the plan of record with commit pointers; empty: not planned yet (the pass plans it)"""
    unfit: tuple[Unfit, ...] = ()
    assignments: tuple[Placement, ...] = ()
    epoch: int = 0
    """the highest epoch handed out for this job so far"""

    def __post_init__(self) -> None:
        where = f"FillJob {self.namespace}/{self.name}"
        if self.total < 1:
            raise ValueError(f"{where}: total {self.total} must be ≥ 1 unit of work (spec.totalSamples/totalSteps)")
        if self.max_parallel_ranks < 1:
            raise ValueError(f"{where}: maxParallelRanks {self.max_parallel_ranks} must be ≥ 1")
        if self.slices:
            check_plan([s.slice for s in self.slices], total=self.total, field=f"{where}: status.slices")
        if self.assignments and not self.slices:
            raise ValueError(f"{where}: assignments without status.slices; the plan is written before any assignment")
        bounds = {(s.start, s.end) for s in self.slices}
        for a in self.assignments:
            if a.fill_job != self.name or (a.start, a.end) not in bounds:
                raise ValueError(
                    f"{where}: assignment of slice [{a.start}, {a.end}) to {a.training_job}/{a.rank} names job "
                    f"{a.fill_job!r} or a slice outside the plan; assignments must be slices of this job's plan"
                )
            if a.epoch > self.epoch:
                raise ValueError(f"{where}: assignment epoch {a.epoch} exceeds the job's epoch {self.epoch}")
        for e, value in (("estimate_step_s", self.estimate_step_s), ("deadline_unix_s", self.deadline_unix_s)):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{where}: {e} {value!r} must be a finite number")

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def active(self) -> bool:
        """Queued or Running: a final phase (Succeeded, Failed, Cancelled) holds no assignments."""
        return self.phase in _ACTIVE_PHASES

    @property
    def parallel_ranks(self) -> int:
        """Ranks that may work on the job at once: ``maxParallelRanks`` for inference, 1 for training."""
        return self.max_parallel_ranks if self.kind == "inference" else 1

    @classmethod
    def from_spec(
        cls,
        job: FillJob,
        *,
        namespace: str = "default",
        created_unix_s: float = 0.0,
        one_filesystem: bool = False,
        **status: Any,
    ) -> FillJobView:
        """The spec's fields from a typed FillJob; ``status`` passes the rest (``phase``, ``slices``, ``profile`` …).
        ``one_filesystem``: every executor sees the same files (``pipefill local``), so any output may be split."""
        spec = job.spec
        est = spec.estimates
        return cls(
            name=job.name,
            total=spec.total,
            namespace=namespace,
            created_unix_s=created_unix_s,
            kind=str(spec.workload.kind),
            priority=spec.priority,
            labels=dict(job.metadata.get("labels") or {}),
            host_selector=spec.host_selector,
            # a relative output without a claim lands in the pod's own scratch directory (docs/fill.md, "Fill
            # storage"): split over two pods, neither holds every slice to assemble outputs.npy; one at a time
            max_parallel_ranks=spec.max_parallel_ranks if one_filesystem or _shared(spec.output) else 1,
            min_slice_units=spec.min_slice_samples,
            storage_claim=spec.output.claim_name,
            estimate_step_s=est.step_milliseconds / 1e3 if est.step_milliseconds is not None else None,
            estimate_peak_bytes=parse_bytes(est.memory, field="spec.estimates.memory")
            if est.memory is not None
            else None,
            **status,
        )


def _shared(output: Location) -> bool:
    """Whether every rank pod may see the same ``output``: on a claim, or at an absolute path (a volume the user
    mounts into each pod through spec.podTemplate); a relative path is the pod's own scratch (``pipefill.pods``)."""
    return output.claim_name is not None or output.path.startswith("/")


@dataclass(frozen=True)
class RankView:
    """One rank pod of a running training job. ``bubble_classes``: what the rank reported (its executor's classes of
    measured bubbles: length, memory the fill may use, count per training step); empty: not reported yet, the pass
    predicts them from the training spec. ``step_s``: measured training step time (None: predicted)."""

    rank: int
    pod: str
    pod_uid: str
    bubble_classes: tuple[BubbleClass, ...] = ()
    step_s: float | None = None

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"rank pod {self.pod}: rank {self.rank} must be ≥ 0")
        if self.step_s is not None and not self.step_s > 0:
            raise ValueError(f"rank pod {self.pod}: step_s {self.step_s!r} must be > 0 seconds")


@dataclass(frozen=True)
class TrainingJobView:
    """A PipelineTrainingJob and its rank pods. Only a ``running`` job with ``fill_enabled`` hosts fill work.
    ``fill_job_selector``: which FillJobs (by label) the job admits (spec.fill.jobSelector; empty admits all);
    ``fill_storage_claim``: the claim of spec.fill.storage (None: no fill storage), which must be a FillJob's."""

    name: str
    namespace: str = "default"
    running: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)
    fill_enabled: bool = True
    fill_job_selector: LabelSelector = field(default_factory=LabelSelector)
    fill_storage_claim: str | None = None
    ranks: tuple[RankView, ...] = ()
    spec: PipelineTrainingJobSpec | None = None
    """for the simulator's prediction of ranks that report no bubble classes yet"""
    schedule_csv: str | None = None
    """the custom schedule's CSV (spec.pipeline.customSchedule's ConfigMap key), for that prediction"""
    guard_s: float = 0.001
    """spec.fill.guardMilliseconds in seconds: kept free before each bubble's end"""

    def __post_init__(self) -> None:
        ranks = [r.rank for r in self.ranks]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"PipelineTrainingJob {self.namespace}/{self.name}: ranks {ranks} repeat a rank")
        if self.spec is None:
            for r in self.ranks:
                if not r.bubble_classes or r.step_s is None:
                    raise ValueError(
                        f"PipelineTrainingJob {self.namespace}/{self.name} rank {r.rank}: no bubble classes and step "
                        "time reported and no spec to predict them from; pass the spec or the reported values"
                    )

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @classmethod
    def from_spec(
        cls,
        job: PipelineTrainingJob,
        *,
        ranks: tuple[RankView, ...],
        namespace: str = "default",
        running: bool = True,
        fill_job_selector: LabelSelector | None = None,
        schedule_csv: str | None = None,
    ) -> TrainingJobView:
        """The spec's fields from a typed PipelineTrainingJob; ``running`` and the ranks from what the operator
        observed; ``fill_job_selector`` overrides spec.fill.jobSelector when given."""
        storage = job.spec.fill.storage
        return cls(
            name=job.name,
            namespace=namespace,
            running=running,
            labels=dict(job.metadata.get("labels") or {}),
            fill_enabled=job.spec.fill.enabled,
            fill_job_selector=fill_job_selector or job.spec.fill.job_selector,
            fill_storage_claim=storage.claim_name if storage is not None else None,
            ranks=ranks,
            spec=job.spec,
            guard_s=job.spec.fill.guard_milliseconds / 1e3,
            schedule_csv=schedule_csv,
        )


@dataclass(frozen=True)
class Snapshot:
    """Everything one pass decides from. ``live_pod_uids``: pods that exist and have not terminated besides the
    ranks listed (pods of a job being torn down, restarted or suspended): their slices wait until they are gone."""

    fill_jobs: tuple[FillJobView, ...]
    training_jobs: tuple[TrainingJobView, ...]
    live_pod_uids: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for what, keys in (
            ("FillJob", [j.key for j in self.fill_jobs]),
            ("PipelineTrainingJob", [t.key for t in self.training_jobs]),
        ):
            if len(set(keys)) != len(keys):
                dup = sorted({k for k in keys if keys.count(k) > 1})
                raise ValueError(f"snapshot: {what} {dup[0][0]}/{dup[0][1]} appears more than once")
        uids = [r.pod_uid for t in self.training_jobs for r in t.ranks]
        if len(set(uids)) != len(uids):
            raise ValueError("snapshot: a pod uid appears on two ranks; each rank pod has its own uid")

    def live(self) -> frozenset[str]:
        """Every pod that has not terminated: the ranks listed and ``live_pod_uids``."""
        return self.live_pod_uids | {r.pod_uid for t in self.training_jobs for r in t.ranks}


def selector_key(selector: LabelSelector) -> tuple[Any, ...]:
    """A hashable form of a label selector, equal for equal selectors (to share work between equal ones)."""
    return (
        tuple(sorted(selector.match_labels.items())),
        tuple((r.key, str(r.operator), tuple(r.values)) for r in selector.match_expressions),
    )
