"""``FillJob``: independent work (batch inference, small training) that runs inside training jobs' bubbles."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from pipefill.spec._schema import Rule, field
from pipefill.spec.common import CONFIG_MAP_NAME_PATTERN, NAME_RULE, LabelSelector, Location, code_source_rules
from pipefill.spec.fillstatus import Assignment, FillJobPhase, FillJobStatus

__all__ = [
    "BUILTIN_WORKLOADS",
    "ENTRY_POINT_GROUP",
    "Assignment",
    "Estimates",
    "FillJob",
    "FillJobPhase",
    "FillJobSpec",
    "FillJobStatus",
    "WorkKind",
    "Workload",
    "WorkloadCode",
]


class WorkKind(enum.StrEnum):
    INFERENCE = "inference"
    TRAINING = "training"


# Builtin workloads and the kind each one is.
BUILTIN_WORKLOADS: dict[str, WorkKind] = {
    "encoder-inference": WorkKind.INFERENCE,
    "train-classifier": WorkKind.TRAINING,
    "sentence-embedding": WorkKind.INFERENCE,
}

# An entry point name in the ``pipefill.workloads`` group (a Python package's workload; docs/fill.md, "User code").
ENTRY_POINT_GROUP = "pipefill.workloads"

_BUILTIN_KIND_CEL = "{" + ", ".join(f"'{k}': '{v.value}'" for k, v in BUILTIN_WORKLOADS.items()) + "}"


@dataclass
class WorkloadCode:
    """Where the module of ``importPath`` comes from when it is not installed in the fill image (docs/fill.md)."""

    path: str | None = field(
        doc="A directory on the training job's fill storage (relative to its mount, spec.fill.storage.mountPath; "
        "pipefill local: the working directory) that holds the module of importPath; its modules import each other "
        "relatively (from . import helpers).",
        max_length=1024,
        default=None,
    )
    config_map: str | None = field(
        doc="A ConfigMap in the FillJob's namespace whose keys are the module files (name.py) of importPath; the fill "
        "executor reads it at job start (pipefill local: the ConfigMap manifests given with -f).",
        max_length=253,
        pattern=CONFIG_MAP_NAME_PATTERN,
        default=None,
    )

    __rules__: ClassVar[tuple[Rule, ...]] = code_source_rules("spec.workload.code")


_SOURCES_CEL = "[has(self.builtin), has(self.importPath), has(self.entryPoint)].filter(x, x).size() == 1"


@dataclass
class Workload:
    """What to run: a builtin workload, a workload a Python package in the fill image registers (entry point), or a
    user class implementing the workload protocol, by import path (docs/fill.md)."""

    kind: WorkKind = field(doc="inference (outputs per sample) or training (checkpoints and a final model).")
    builtin: str | None = field(
        doc="Builtin workload: " + ", ".join(BUILTIN_WORKLOADS) + ".",
        pattern="^(" + "|".join(BUILTIN_WORKLOADS) + ")$",
        default=None,
    )
    entry_point: str | None = field(
        doc=f"A workload a Python package installed in the fill image registers under the entry point group "
        f"{ENTRY_POINT_GROUP} (a fill image built FROM ours).",
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$",
        max_length=128,
        default=None,
    )
    import_path: str | None = field(
        doc="A user workload class as package.module:Class, importable in the fill image or loaded from code.",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$",
        max_length=512,
        default=None,
    )
    code: WorkloadCode | None = field(
        doc="Where importPath's module comes from when the fill image does not hold it: a directory on the fill "
        "storage or a ConfigMap; loaded when the job starts.",
        default=None,
    )
    parameters: dict[str, Any] = field(
        doc="Free-form parameters passed to the workload.", free_form=True, default_factory=dict
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule=_SOURCES_CEL,
            message="spec.workload: set exactly one of builtin, entryPoint and importPath",
            reason="FieldValueRequired",
        ),
        Rule(
            rule="!has(self.code) || has(self.importPath)",
            message="spec.workload.code says where importPath's module comes from; set importPath "
            "(package.module:Class) or remove code",
            field_path=".code",
            reason="FieldValueRequired",
        ),
        Rule(
            rule=f"!has(self.builtin) || {_BUILTIN_KIND_CEL}[self.builtin] == self.kind",
            message="spec.workload.kind does not match the builtin workload's kind",
            message_expression="'spec.workload.kind is %s but builtin %s is of kind %s; set kind: %s'.format("
            f"[self.kind, self.builtin, {_BUILTIN_KIND_CEL}[self.builtin], {_BUILTIN_KIND_CEL}[self.builtin]])",
            field_path=".kind",
        ),
    )


@dataclass
class Estimates:
    """Optional hints for placement before the fill executor has profiled the workload."""

    memory: int | str | None = field(
        doc="Peak device memory at the smallest batch (quantity).", quantity=True, default=None
    )
    step_milliseconds: float | None = field(
        doc="Time of one step at the smallest batch.",
        unit="ms",
        minimum=0,
        exclusive_minimum=True,
        maximum=3.6e6,
        default=None,
    )


@dataclass
class FillJobSpec:
    """Desired state of a FillJob."""

    workload: Workload = field(doc="What to run.")
    output: Location = field(
        doc="Where outputs (inference) or checkpoints and the final model (training) go. With claimName: a path on "
        "that claim, relative to its root, and only training jobs whose spec.fill.storage.claimName is that claim "
        "host the job (every fill sidecar of theirs mounts it at fill.storage.mountPath); without: a path inside "
        "the fill sidecar, and only training jobs without fill storage host it (docs/fill.md)."
    )
    input: Location | None = field(
        doc="Dataset file the workload reads, on the same storage as output (its claimName, when set, must be "
        "output's); builtins generate a synthetic one when absent.",
        default=None,
    )
    total_samples: int | None = field(
        doc="Samples to process (inference) or to train on.", minimum=1, maximum=10**12, default=None
    )
    total_steps: int | None = field(
        doc="Optimizer steps to train (training only).", minimum=1, maximum=10**12, default=None
    )
    priority: int = field(doc="Higher runs first among queued fill jobs.", minimum=-1000, maximum=1000, default=0)
    deadline: str | None = field(
        doc="Finish by this time (RFC 3339); earliest deadline first among equal priorities.",
        fmt="date-time",
        default=None,
    )
    estimates: Estimates = field(doc="Memory and time hints.", default_factory=lambda: Estimates())
    host_selector: LabelSelector = field(
        doc="Which PipelineTrainingJobs (by label) may host this work; empty: any.",
        default_factory=lambda: LabelSelector(),
    )
    max_parallel_ranks: int = field(
        doc="Ranks that may work on this job at once: an inference job is split into slices of samples that up to this "
        "many fill executors claim, a faster one taking more; a training job runs on one rank (must be 1). On a "
        "cluster a job whose output is a relative path without claimName is not split (it lands in one pod's "
        "scratch). At most 1024: the status keeps one report per rank and four slices per rank.",
        minimum=1,
        maximum=1024,
        default=1,
    )
    min_slice_samples: int = field(
        doc="The fewest samples in one slice of an inference job split across ranks (spec.maxParallelRanks > 1): "
        "it is cut into four slices per rank, fewer where a slice would hold less than this. Each slice costs "
        "its executor a start-up, commits and a hand-over, tens of milliseconds of bubble time: as much as the "
        "work of a few dozen fast samples. Lower it for a workload whose samples each take long.",
        minimum=1,
        default=512,
    )
    suspend: bool = field(
        doc="Pause the job: the operator releases its assignments (executors stop at their next commit) and keeps "
        "its progress; setting it back to false queues the rest again (as spec.suspend of a batch/v1 Job).",
        default=False,
    )
    cancel: bool = field(
        doc="Stop the job for good: the operator revokes its assignments and the job ends Cancelled with the work "
        "committed so far. Cannot be undone (create a new FillJob); deleting the FillJob also stops it, but "
        "removes its status record.",
        default=False,
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="has(self.totalSamples) != has(self.totalSteps)",
            message="spec: set exactly one of totalSamples and totalSteps",
            reason="FieldValueRequired",
        ),
        Rule(
            rule="self.workload.kind != 'inference' || has(self.totalSamples)",
            message="spec.totalSamples is required for inference workloads (totalSteps is for training)",
            field_path=".totalSamples",
            reason="FieldValueRequired",
        ),
        Rule(
            rule="self.workload.kind != 'training' || self.maxParallelRanks == 1",
            message="spec.maxParallelRanks must be 1 for a training workload: its optimizer steps are one sequence "
            "and run on one rank (only inference jobs are split across ranks); remove maxParallelRanks or set it to 1",
            message_expression="'spec.maxParallelRanks is %d but must be 1 for a "
            "training workload: its optimizer steps are one sequence and run on one rank (only inference jobs are "
            "split across ranks); remove maxParallelRanks or set it to 1'.format([self.maxParallelRanks])",
            field_path=".maxParallelRanks",
        ),
        Rule(
            rule="!has(self.input) || !has(self.input.claimName) || (has(self.output.claimName) && "
            "self.input.claimName == self.output.claimName)",
            message="spec.input.claimName must be spec.output.claimName: a job's input and output live on one fill "
            "storage claim, the one its hosts mount (spec.fill.storage of the training job); use the same claim or "
            "leave input.claimName out",
            field_path=".input.claimName",
        ),
        # Update-only (transition) rules: progress, slices and outputs are counted against these four fields.
        Rule(
            rule="has(self.totalSamples) == has(oldSelf.totalSamples) && (!has(self.totalSamples) || self.totalSamples"
            " == oldSelf.totalSamples)",
            message="spec.totalSamples is immutable: progress and slices are counted against it; create a new FillJob",
            field_path=".totalSamples",
        ),
        Rule(
            rule="self.maxParallelRanks == oldSelf.maxParallelRanks",
            message="spec.maxParallelRanks is immutable: the slice plan is fixed when the job is first scheduled; "
            "create a new FillJob",
            field_path=".maxParallelRanks",
        ),
        Rule(
            rule="self.minSliceSamples == oldSelf.minSliceSamples",
            message="spec.minSliceSamples is immutable: the slice plan is fixed when the job is first scheduled; "
            "create a new FillJob",
            field_path=".minSliceSamples",
        ),
        Rule(
            rule="self.cancel || !oldSelf.cancel",
            message="spec.cancel cannot be set back to false: a cancelled FillJob stays cancelled; create a new "
            "FillJob (to pause and resume, use spec.suspend)",
            field_path=".cancel",
        ),
        Rule(
            rule="self.output == oldSelf.output",
            message="spec.output is immutable: committed outputs are already there; create a new FillJob",
            field_path=".output",
        ),
    )

    @property
    def total(self) -> int:
        """Units of work to do: samples or steps."""
        total = self.total_samples if self.total_samples is not None else self.total_steps
        if total is None:
            raise ValueError("spec: set exactly one of totalSamples and totalSteps")
        return total


@dataclass
class FillJob:
    """Work that runs inside pipeline bubbles (pipefill.io/v1alpha1)."""

    metadata: dict[str, Any] = field(doc="Standard object metadata.", free_form=True)
    spec: FillJobSpec = field(doc="Desired state.")
    api_version: str = field(doc="pipefill.io/v1alpha1", default="pipefill.io/v1alpha1")
    kind: str = field(doc="FillJob", default="FillJob")
    status: FillJobStatus | None = field(doc="Observed state.", default=None)

    __rules__: ClassVar[tuple[Rule, ...]] = (NAME_RULE,)

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))
