"""``PipelineTrainingJob``: a pipeline-parallel training job whose bubbles PipeFill fills.

The spec's parts live in modules of one concern each (``model``, ``pipeline``, ``resources``, ``runpolicy``,
``scheduling``, ``podtemplate``); this module assembles them and re-exports their names, so
``from pipefill.spec.training import Data`` keeps working.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from pipefill.spec._schema import DERIVED, Rule, field
from pipefill.spec.command import TrainerCommand
from pipefill.spec.common import NAME_RULE, Condition
from pipefill.spec.immutable import RECREATE, immutable, same
from pipefill.spec.model import LAYERS_CEL, MODEL_PRESETS, Data, DataSource, Model, Optimizer
from pipefill.spec.pipeline import ConfigMapKey, Pipeline, Schedule
from pipefill.spec.podtemplate import PodTemplate
from pipefill.spec.resources import FillSettings, GpuSharing, Mps, Resources, SharingMode
from pipefill.spec.runpolicy import Checkpoint, RunPolicy
from pipefill.spec.scheduling import GangMode, Scheduling

__all__ = [
    "MODEL_PRESETS",
    "Checkpoint",
    "ConfigMapKey",
    "Data",
    "DataSource",
    "FillSettings",
    "GangMode",
    "GpuSharing",
    "JobPhase",
    "Model",
    "Mps",
    "Optimizer",
    "Pipeline",
    "PipelineTrainingJob",
    "PipelineTrainingJobSpec",
    "PipelineTrainingJobStatus",
    "PodTemplate",
    "Resources",
    "RunPolicy",
    "Schedule",
    "Scheduling",
    "SharingMode",
    "TrainerCommand",
]


_M = TypeVar("_M")
# CEL: the job's checkpoints are dcp (pipefill_trainer.runtime resolves an unset format the same way)
_DCP = (
    "(has(self.checkpoint.format) ? self.checkpoint.format == 'dcp' : has(self.model) && has(self.model.huggingFace))"
)


class JobPhase(enum.StrEnum):
    """Where a job is in its life (docs/operator.md#lifecycle); conditions carry the reasons."""

    PENDING = "Pending"  # pods of the current generation are being created or scheduled
    WAITING = "Waiting"  # something the job needs is missing (a ConfigMap, a GPU resource); clears by itself
    RUNNING = "Running"  # every rank's trainer runs
    RESTARTING = "Restarting"  # the old generation is being deleted; the next one starts once it is gone
    SUSPENDED = "Suspended"  # spec.runPolicy.suspend: no pods, checkpoints kept
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass
class PipelineTrainingJobSpec:
    """Desired state of a PipelineTrainingJob."""

    pipeline: Pipeline = field(
        doc="Stages, microbatches, schedule of our trainer; required unless spec.trainer runs your own command.",
        default_factory=lambda: _derived(Pipeline(stages=1, microbatches=1, global_batch=1)),
        schema_optional=True,
    )
    model: Model = field(
        doc="The decoder our trainer trains; required unless spec.trainer runs your own command.",
        default_factory=lambda: _derived(Model()),
        schema_optional=True,
    )
    trainer: TrainerCommand | None = field(
        doc='Your own training command in place of our trainer (docs/trainer.md, "Your own training command").',
        default=None,
    )
    trainer_image: str = field(
        doc="Image of the trainer container.", max_length=1024, default="ghcr.io/pipefill/trainer:0.1.0"
    )
    fill_image: str = field(
        doc="Image of the fill-executor sidecar.", max_length=1024, default="ghcr.io/pipefill/fill:0.1.0"
    )
    data: Data = field(doc="Training data.", default_factory=lambda: Data())
    optimizer: Optimizer = field(doc="Optimizer.", default_factory=lambda: Optimizer())
    steps: int = field(doc="Optimizer steps to train.", minimum=1, maximum=10**9, default=100)
    checkpoint: Checkpoint = field(doc="Checkpointing.", default_factory=lambda: Checkpoint())
    resources: Resources = field(doc="Per-rank resources.", default_factory=lambda: Resources())
    gpu_sharing: GpuSharing = field(doc="GPU sharing between trainer and fill.", default_factory=lambda: GpuSharing())
    fill: FillSettings = field(doc="Bubble filling.", default_factory=lambda: FillSettings())
    run_policy: RunPolicy = field(doc="Restarts and lifetime.", default_factory=lambda: RunPolicy())
    scheduling: Scheduling = field(doc="Scheduling.", default_factory=lambda: Scheduling())
    pod_template: PodTemplate = field(
        doc="Added to every rank pod: labels, tolerations, node selector, affinity, secrets, volumes, host network.",
        default_factory=lambda: PodTemplate(),
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="has(self.trainer) || (has(self.model) && has(self.pipeline))",
            message="spec.model and spec.pipeline are required for our trainer; set them, or set spec.trainer to run "
            "your own training command",
            field_path=".pipeline",
            reason="FieldValueRequired",
        ),
        Rule(
            rule="!has(self.trainer) || (!has(self.model) && !has(self.pipeline))",
            message="spec.trainer runs your own command, which builds its own model and schedule: remove spec.model "
            "and spec.pipeline (the stage count is spec.trainer.stages)",
            field_path=".trainer",
        ),
        Rule(
            # An unknown preset is the pattern's error; this rule must not fail on its map lookup as well.
            rule="!has(self.model) || !has(self.pipeline) || "
            f"self.pipeline.stages * self.pipeline.virtualStages <= (has(self.model.preset) ? (self.model.preset in"
            f" {LAYERS_CEL} ? {LAYERS_CEL}[self.model.preset] : 1048576)"
            " : (has(self.model.layers) ? self.model.layers : 1048576))",
            message="spec.pipeline: stages × virtualStages must not exceed the model's layers",
            message_expression="'spec.pipeline: stages × virtualStages = %d exceeds the model\\'s %d layers; every stage"
            " needs at least one layer: use fewer stages or a larger model'.format([self.pipeline.stages *"
            f" self.pipeline.virtualStages, has(self.model.preset) ? {LAYERS_CEL}[self.model.preset] : self.model.layers])",
            field_path=".pipeline.stages",
        ),
        Rule(
            rule="!has(self.model) || !has(self.model.python) || !has(self.model.python.code) || !has(self.model.python.code.path)"
            " || has(self.fill.storage)",
            message="spec.model.python.code.path is a directory on the fill storage: set spec.fill.storage (a claim) "
            "or use code.configMap or an image that holds the code",
            field_path=".model.python.code.path",
        ),
        Rule(
            rule="!has(self.model) || !has(self.model.huggingFace) || !has(self.model.huggingFace.exportPath)"
            " || !has(self.checkpoint.format) || self.checkpoint.format == 'dcp'",
            message="spec.model.huggingFace.exportPath reads the final dcp checkpoint: set spec.checkpoint.format dcp"
            " (or leave it unset) or remove exportPath",
            field_path=".checkpoint.format",
        ),
        Rule(
            rule="self.gpuSharing.mode == 'none' || self.resources.gpus >= 1",
            message="spec.gpuSharing.mode dra or visibleDevices needs spec.resources.gpus >= 1; set mode: none to train on CPU",
            field_path=".gpuSharing.mode",
        ),
        Rule(
            rule="self.gpuSharing.mode != 'visibleDevices' || self.resources.gpus == 1",
            message="spec.gpuSharing.mode visibleDevices supports exactly one GPU per rank",
            message_expression="'spec.resources.gpus is %d but gpuSharing mode visibleDevices supports exactly one GPU"
            " per rank (the fill selects the trainer\\'s GPU by its UUID); set gpus: 1 or use mode dra'.format("
            "[self.resources.gpus])",
            field_path=".resources.gpus",
        ),
        Rule(
            rule="!self.gpuSharing.mps.enabled || self.gpuSharing.mode != 'none'",
            message="spec.gpuSharing.mps.enabled needs a shared GPU (mode dra or visibleDevices)",
            field_path=".gpuSharing.mps.enabled",
        ),
        Rule(
            rule="!has(self.scheduling.gangMinMembers) || self.scheduling.gangMinMembers <= (has(self.trainer) ?"
            " self.trainer.stages * self.trainer.dataParallel : has(self.pipeline) ?"
            " self.pipeline.stages * self.pipeline.dataParallel : 1048576)",
            message="spec.scheduling.gangMinMembers cannot exceed the job's pods (stages × dataParallel)",
            field_path=".scheduling.gangMinMembers",
        ),
        # Update-only rules that need two parts of the spec; the others sit on the part they guard
        # (docs/operator.md, "Changing a running job").
        Rule(
            rule="has(self.trainer) == has(oldSelf.trainer)",
            message="spec.trainer cannot be added or removed: our trainer and your own command keep different "
            f"checkpoints and pods; {RECREATE}",
            field_path=".trainer",
        ),
        immutable(
            "resources.gpus",
            path="spec.resources.gpus",
            why="with gpuSharing.mode dra the job's ResourceClaimTemplate claims that many, made when it first starts",
            when="self.gpuSharing.mode == 'dra'",
        ),
        *(
            Rule(
                rule=f"!has(self.pipeline) || !has(oldSelf.pipeline) || {_DCP} || ({same(f'pipeline.{camel}')})",
                message=f"spec.pipeline.{camel} is immutable with spec.checkpoint.format torch: each rank's "
                "checkpoint holds its own stages and loads only into the layer cut that wrote it; set "
                "spec.checkpoint.format dcp in a new job (its checkpoints reshard) or "
                f"{RECREATE}",
                field_path=f".pipeline.{camel}",
            )
            for camel in ("virtualStages", "layersPerStage")
        ),
    )

    def __post_init__(self) -> None:
        """With spec.trainer, the pipeline the rest of the system sees is the command's rank layout (schedule and
        microbatches are the command's own): derived, never written back (:func:`pipefill.spec.to_obj` leaves it
        out). The command's retryable exit codes join spec.runPolicy.restartOnExitCodes."""
        t = self.trainer
        if t is None:
            return
        self.pipeline = _derived(
            Pipeline(stages=t.stages, microbatches=1, global_batch=t.data_parallel, data_parallel=t.data_parallel,
                     schedule=Schedule.GPIPE)
        )  # fmt: skip
        codes = self.run_policy.restart_on_exit_codes
        self.run_policy.restart_on_exit_codes = sorted({*codes, *t.retry_exit_codes})


def _derived(value: _M) -> _M:
    """Mark a spec part that was not written but derived (a placeholder, or the command's layout)."""
    object.__setattr__(value, DERIVED, True)
    return value


@dataclass
class PipelineTrainingJobStatus:
    """Observed state, written by the operator (or by `pipefill local`)."""

    phase: JobPhase = field(
        doc="Pending, Waiting, Running, Restarting, Suspended, Succeeded or Failed.", default=JobPhase.PENDING
    )
    conditions: list[Condition] = field(
        doc="Created, Running, Restarting, Succeeded, Failed, Suspended, InvalidSpec, Waiting, CheckpointsShared, "
        "SpecChangePending, StartBlocked.",
        max_items=16,
        default_factory=list,
    )
    generation: int = field(
        doc="Gang generation: the pods of one start of the whole job carry it as label pipefill.io/generation; "
        "every restart or resume creates the next one (not metadata.generation, see observedGeneration).",
        minimum=0,
        default=0,
    )
    ranks_ready: int = field(doc="Ranks whose trainer runs.", minimum=0, default=0)
    current_step: int = field(doc="Last completed optimizer step (over restarts).", minimum=0, default=0)
    progress: float | None = field(doc="currentStep as a percent of spec.steps.", minimum=0, maximum=100, default=None)
    estimated_completion_time: str | None = field(
        doc="When the last step should end at the slowest rank's mean step time so far.", fmt="date-time", default=None
    )
    loss: float | None = field(doc="Training loss of the last step the ranks reported (nats).", default=None)
    bubble_fraction: float | None = field(
        doc="Idle time ÷ step time, mean over ranks.", minimum=0, maximum=1, default=None
    )
    fill_utilization: float | None = field(
        doc="Fill busy time ÷ bubble time (bubble recovery).", minimum=0, default=None
    )
    restarts: int = field(
        doc="Whole-job restarts after retryable trainer failures (limited by backoffLimit).", minimum=0, default=0
    )
    disruptions: int = field(
        doc="Whole-job restarts after an eviction, a preemption or a lost node (not counted against backoffLimit).",
        minimum=0,
        default=0,
    )
    fill_restarts: int = field(
        doc="Restarts of fill-executor sidecars in the current generation.", minimum=0, default=0
    )
    start_time: str | None = field(doc="When the current run started (reset on resume).", fmt="date-time", default=None)
    completion_time: str | None = field(doc="When the job finished.", fmt="date-time", default=None)
    observed_generation: int | None = field(doc="metadata.generation this status describes.", minimum=0, default=None)


@dataclass
class PipelineTrainingJob:
    """A pipeline-parallel training job (pipefill.io/v1alpha1)."""

    metadata: dict[str, Any] = field(doc="Standard object metadata.", free_form=True)
    spec: PipelineTrainingJobSpec = field(doc="Desired state.")
    api_version: str = field(doc="pipefill.io/v1alpha1", default="pipefill.io/v1alpha1")
    kind: str = field(doc="PipelineTrainingJob", default="PipelineTrainingJob")
    status: PipelineTrainingJobStatus | None = field(doc="Observed state.", default=None)

    __rules__: ClassVar[tuple[Rule, ...]] = (NAME_RULE,)

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def world_size(self) -> int:
        """Ranks of the whole job: stages × data-parallel replicas."""
        return self.spec.pipeline.stages * self.spec.pipeline.data_parallel
