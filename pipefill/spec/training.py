"""``PipelineTrainingJob``: a pipeline-parallel training job whose bubbles PipeFill fills."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from pipefill.spec._schema import Rule, field
from pipefill.spec.common import NAME_RULE, Condition

__all__ = [
    "MODEL_PRESETS",
    "Checkpoint",
    "ConfigMapKey",
    "Data",
    "DataSource",
    "FillSettings",
    "GpuSharing",
    "Model",
    "Mps",
    "Optimizer",
    "Pipeline",
    "PipelineTrainingJob",
    "PipelineTrainingJobSpec",
    "PipelineTrainingJobStatus",
    "Resources",
    "RunPolicy",
    "Schedule",
    "Scheduling",
    "SharingMode",
]

# Named GPT-style decoders: preset -> (layers, hidden size, attention heads).
MODEL_PRESETS: dict[str, tuple[int, int, int]] = {
    "gpt-tiny": (4, 128, 4),
    "gpt2-small": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt-1.3b": (24, 2048, 16),
    "gpt-7b": (32, 4096, 32),
    "gpt-40b": (48, 8192, 64),
}

_LAYERS_CEL = "{" + ", ".join(f"'{k}': {v[0]}" for k, v in MODEL_PRESETS.items()) + "}"


class Schedule(enum.StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZERO_BUBBLE_H1 = "zero-bubble-h1"
    ZBV = "zbv"
    CUSTOM = "custom"


class DataSource(enum.StrEnum):
    SYNTHETIC = "synthetic"
    TOKEN_FILE = "tokenFile"
    TEXT = "text"


class SharingMode(enum.StrEnum):
    DRA = "dra"
    VISIBLE_DEVICES = "visibleDevices"
    NONE = "none"


@dataclass
class Model:
    """The GPT-style decoder to train: a named preset, or layers, hiddenSize and heads."""

    preset: str | None = field(
        doc="Named model size (" + ", ".join(MODEL_PRESETS) + "); excludes layers, hiddenSize and heads.",
        pattern="^(" + "|".join(k.replace(".", r"\.") for k in MODEL_PRESETS) + ")$",
        default=None,
    )
    layers: int | None = field(
        doc="Decoder blocks; split over the pipeline's stages.", minimum=1, maximum=1024, default=None
    )
    hidden_size: int | None = field(doc="Model width; a multiple of heads.", minimum=8, maximum=65536, default=None)
    heads: int | None = field(doc="Attention heads per block.", minimum=1, maximum=1024, default=None)
    seq_len: int = field(doc="Tokens per sample (context length).", minimum=8, maximum=1048576, default=128)
    vocab_size: int = field(
        doc="Vocabulary size; 256 is the byte-level tokenizer.", minimum=2, maximum=1048576, default=256
    )
    tied_embeddings: bool = field(
        doc="Share the token embedding with the output head (on the first and last stage).", default=False
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="has(self.preset) ? !has(self.layers) && !has(self.hiddenSize) && !has(self.heads)"
            " : has(self.layers) && has(self.hiddenSize) && has(self.heads)",
            message="spec.model: set either preset, or all of layers, hiddenSize and heads (not both)",
            reason="FieldValueRequired",
        ),
        Rule(
            rule="!has(self.hiddenSize) || !has(self.heads) || self.hiddenSize % self.heads == 0",
            message="spec.model.hiddenSize must be a multiple of heads",
            message_expression="'spec.model.hiddenSize %d must be a multiple of heads (%d); set hiddenSize to %d"
            " or heads to a divisor of it'.format([self.hiddenSize, self.heads,"
            " self.hiddenSize / self.heads * self.heads + self.heads])",
            field_path=".hiddenSize",
        ),
    )

    def dims(self) -> tuple[int, int, int]:
        """(layers, hidden size, heads), resolving the preset."""
        if self.preset is not None:
            return MODEL_PRESETS[self.preset]
        if self.layers is None or self.hidden_size is None or self.heads is None:
            raise ValueError("spec.model: set either preset, or all of layers, hiddenSize and heads")
        return self.layers, self.hidden_size, self.heads


@dataclass
class Data:
    """Where training tokens come from."""

    source: DataSource = field(
        doc="synthetic (random tokens), tokenFile (uint16 tokens, memory-mapped) or text (UTF-8 bytes).",
        default=DataSource.SYNTHETIC,
    )
    path: str | None = field(
        doc="File path inside the trainer container; required for tokenFile and text.", max_length=4096, default=None
    )
    claim_name: str | None = field(
        doc="PersistentVolumeClaim holding the file, mounted read-only at the path's directory.",
        max_length=253,
        default=None,
    )
    seed: int = field(doc="Seed for synthetic tokens and data order.", minimum=0, maximum=2**31 - 1, default=0)

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="self.source == 'synthetic' ? !has(self.path) : has(self.path)",
            message="spec.data.path is required for source tokenFile and text, and not allowed for synthetic",
            field_path=".path",
            reason="FieldValueRequired",
        ),
    )


@dataclass
class Pipeline:
    """How the model is cut into stages and how microbatches flow through them."""

    stages: int = field(doc="Pipeline ranks per replica (one pod, one GPU each).", minimum=1, maximum=1024)
    microbatches: int = field(doc="Microbatches per step per pipeline replica.", minimum=1, maximum=65536)
    global_batch: int = field(doc="Samples per optimizer step over all replicas.", minimum=1, maximum=16777216)
    schedule: Schedule = field(doc="Per-rank order of forward and backward actions.", default=Schedule.ONE_F_ONE_B)
    virtual_stages: int = field(
        doc="Model stages per rank (interleaved-1f1b, zero-bubble-h1; zbv needs 2).", minimum=1, maximum=16, default=1
    )
    data_parallel: int = field(
        doc="Replicas of the whole pipeline; gradients are all-reduced per stage.", minimum=1, maximum=65536, default=1
    )
    activation_checkpointing: bool = field(
        doc="Recompute activations in backward instead of keeping them (less memory, ~1/3 more compute).", default=False
    )
    custom_schedule: ConfigMapKey | None = field(
        doc="ConfigMap key holding a compute-only schedule CSV; required with schedule custom.", default=None
    )
    layers_per_stage: list[int] | None = field(
        doc="Explicit decoder blocks per stage (stages × virtualStages entries); default: balanced by cost.",
        max_items=16384,
        default=None,
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="self.globalBatch % (self.microbatches * self.dataParallel) == 0",
            message="spec.pipeline.globalBatch must be divisible by microbatches × dataParallel",
            message_expression="'spec.pipeline.globalBatch %d must be divisible by microbatches × dataParallel = %d;"
            " use a multiple such as %d'.format([self.globalBatch, self.microbatches * self.dataParallel,"
            " (self.globalBatch / (self.microbatches * self.dataParallel) + 1) * self.microbatches * self.dataParallel])",
            field_path=".globalBatch",
        ),
        Rule(
            rule="self.virtualStages == 1 || self.schedule in ['interleaved-1f1b', 'zero-bubble-h1', 'zbv', 'custom']",
            message="spec.pipeline.virtualStages > 1 needs schedule interleaved-1f1b, zero-bubble-h1, zbv or custom",
            message_expression="'spec.pipeline.virtualStages %d is not allowed with schedule %s: only interleaved-1f1b,"
            " zero-bubble-h1, zbv and custom run several stages per rank; set virtualStages: 1 or change the"
            " schedule'.format([self.virtualStages, self.schedule])",
            field_path=".virtualStages",
        ),
        Rule(
            rule="self.schedule != 'zbv' || self.virtualStages == 2",
            message="spec.pipeline.virtualStages must be 2 for schedule zbv (the V places two stages on each rank)",
            field_path=".virtualStages",
        ),
        Rule(
            rule="(self.schedule == 'custom') == has(self.customSchedule)",
            message="spec.pipeline.customSchedule is required with schedule custom and not allowed otherwise",
            field_path=".customSchedule",
            reason="FieldValueRequired",
        ),
        Rule(
            rule="!has(self.layersPerStage) || size(self.layersPerStage) == self.stages * self.virtualStages",
            message="spec.pipeline.layersPerStage needs one entry per stage (stages × virtualStages)",
            message_expression="'spec.pipeline.layersPerStage has %d entries, needs stages × virtualStages = %d'.format("
            "[size(self.layersPerStage), self.stages * self.virtualStages])",
            field_path=".layersPerStage",
        ),
        # The schedule generators' own arithmetic rules (pipefill.schedules.generators.build_schedule), held by
        # admission too so `kubectl apply` refuses what the trainer would refuse at start.
        Rule(
            rule="self.schedule != '1f1b' || self.microbatches >= self.stages",
            message="spec.pipeline.microbatches must be at least stages for schedule 1f1b",
            message_expression="'spec.pipeline.microbatches %d is fewer than the %d stages: schedule 1f1b needs"
            " microbatches >= stages; raise microbatches or use gpipe'.format([self.microbatches, self.stages])",
            field_path=".microbatches",
        ),
        Rule(
            rule="!(self.schedule in ['interleaved-1f1b', 'zero-bubble-h1']) || self.microbatches % (self.microbatches"
            " / self.stages > 1 ? self.microbatches / self.stages : 1) == 0",
            message="spec.pipeline.microbatches must be a multiple of its rounds max(1, microbatches / stages)",
            message_expression="'spec.pipeline.microbatches %d is not a multiple of its rounds max(1, microbatches /"
            " stages) = %d, which schedule %s needs; use a multiple of stages (%d)'.format([self.microbatches,"
            " self.microbatches / self.stages, self.schedule, self.stages])",
            field_path=".microbatches",
        ),
    )


@dataclass
class ConfigMapKey:
    """A key of a ConfigMap in the job's namespace."""

    name: str = field(doc="ConfigMap name.", max_length=253)
    key: str = field(doc="Key inside the ConfigMap.", max_length=253, default="schedule.csv")


@dataclass
class Optimizer:
    """AdamW settings."""

    learning_rate: float = field(doc="Peak learning rate.", minimum=0, maximum=10, exclusive_minimum=True, default=3e-4)
    weight_decay: float = field(doc="Decoupled weight decay.", minimum=0, maximum=1, default=0.1)
    beta1: float = field(doc="AdamW β1.", minimum=0, maximum=1, default=0.9)
    beta2: float = field(doc="AdamW β2.", minimum=0, maximum=1, default=0.95)
    grad_clip: float = field(
        doc="Clip the global gradient norm to this; 0 disables clipping.", minimum=0, maximum=1e6, default=1.0
    )
    warmup_steps: int = field(doc="Linear learning-rate warm-up steps.", minimum=0, maximum=10**9, default=0)


@dataclass
class Checkpoint:
    """Where and how often each rank saves its state (atomically: write, then rename)."""

    path: str = field(doc="Directory inside the trainer container.", max_length=4096, default="/checkpoints")
    claim_name: str | None = field(
        doc="PersistentVolumeClaim mounted at path; without one checkpoints live in an emptyDir and survive container restarts only.",
        max_length=253,
        default=None,
    )
    interval_steps: int = field(doc="Save every N steps; 0 saves only at the end.", minimum=0, maximum=10**9, default=0)


@dataclass
class Resources:
    """Resources of each rank's pod."""

    gpus: int = field(doc="GPUs per rank; 0 trains on CPU.", minimum=0, maximum=16, default=1)
    gpu_resource_name: str = field(
        doc="Extended resource of the device plugin.", max_length=253, default="nvidia.com/gpu"
    )
    cpu: int | str = field(
        doc="CPU request of the trainer container (Kubernetes quantity).", quantity=True, default="4"
    )
    memory: int | str = field(
        doc="Memory request of the trainer container (Kubernetes quantity).", quantity=True, default="16Gi"
    )


@dataclass
class Mps:
    """NVIDIA MPS: fill kernels run beside the trainer's instead of time-slicing with them."""

    enabled: bool = field(doc="Run the fill executor as an MPS client.", default=False)
    fill_client_priority: int = field(
        doc="CUDA_MPS_CLIENT_PRIORITY of the fill (1 = below normal).", minimum=0, maximum=1, default=1
    )
    fill_active_thread_percentage: int = field(
        doc="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of the fill.", minimum=1, maximum=100, default=100
    )
    fill_pinned_memory_limit: int | str | None = field(
        doc="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT of the fill (quantity); default: fill.reservedMemory.",
        quantity=True,
        default=None,
    )


@dataclass
class GpuSharing:
    """How the trainer and the fill executor share the rank's GPU."""

    mode: SharingMode = field(
        doc="dra: one ResourceClaim for both containers; visibleDevices: fill selects the trainer's GPU by UUID; none: fill on CPU only.",
        default=SharingMode.DRA,
    )
    device_class_name: str = field(doc="DRA DeviceClass to claim from.", max_length=253, default="gpu.nvidia.com")
    mps: Mps = field(doc="MPS options.", default_factory=lambda: Mps())


@dataclass
class FillSettings:
    """How bubbles are offered to fill work."""

    enabled: bool = field(doc="Run the fill executor and announce bubbles.", default=True)
    reserved_memory: int | str = field(
        doc="Device memory kept free for fill work (quantity).", quantity=True, default="2Gi"
    )
    min_bubble_milliseconds: float = field(
        doc="Bubbles shorter than this are not announced.", unit="ms", minimum=0, maximum=60000, default=5.0
    )
    guard_milliseconds: float = field(
        doc="The fill must yield this long before a bubble's expected end.",
        unit="ms",
        minimum=0,
        maximum=60000,
        default=1.0,
    )


@dataclass
class RunPolicy:
    """Restart and lifetime policy."""

    backoff_limit: int = field(
        doc="Whole-job restarts from the last checkpoint before the job fails.", minimum=0, maximum=1000, default=3
    )
    restart_on_exit_codes: list[int] = field(
        doc="Trainer exit codes that count as retryable.", max_items=64, default_factory=lambda: [75, 137, 143]
    )
    suspend: bool = field(doc="Suspended jobs have no pods (Kueue sets this).", default=False)
    ttl_seconds_after_finished: int | None = field(
        doc="Delete the job this long after it finished.", unit="s", minimum=0, maximum=10**9, default=None
    )
    active_deadline_seconds: int | None = field(
        doc="Fail the job after this long running.", unit="s", minimum=1, maximum=10**9, default=None
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="self.restartOnExitCodes.all(c, c >= 1 && c <= 255)",
            message="spec.runPolicy.restartOnExitCodes entries must be exit codes 1–255",
            field_path=".restartOnExitCodes",
        ),
    )


@dataclass
class Scheduling:
    """Gang scheduling and queueing."""

    scheduler_name: str | None = field(
        doc="Pod scheduler, e.g. volcano or scheduler-plugins for gang scheduling.", max_length=253, default=None
    )
    queue_name: str | None = field(
        doc="Kueue LocalQueue (label kueue.x-k8s.io/queue-name).", max_length=63, default=None
    )
    priority_class_name: str | None = field(doc="PriorityClass of the pods.", max_length=253, default=None)
    gang_min_members: int | None = field(
        doc="PodGroup minMember; default: all ranks.", minimum=1, maximum=1048576, default=None
    )


@dataclass
class PipelineTrainingJobSpec:
    """Desired state of a PipelineTrainingJob."""

    pipeline: Pipeline = field(doc="Stages, microbatches, schedule.")
    model: Model = field(doc="The decoder to train.")
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

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            # An unknown preset is the pattern's error; this rule must not fail on its map lookup as well.
            rule=f"self.pipeline.stages * self.pipeline.virtualStages <= (has(self.model.preset) ? (self.model.preset in"
            f" {_LAYERS_CEL} ? {_LAYERS_CEL}[self.model.preset] : 1048576)"
            " : (has(self.model.layers) ? self.model.layers : 1048576))",
            message="spec.pipeline: stages × virtualStages must not exceed the model's layers",
            message_expression="'spec.pipeline: stages × virtualStages = %d exceeds the model\\'s %d layers; every stage"
            " needs at least one layer: use fewer stages or a larger model'.format([self.pipeline.stages *"
            f" self.pipeline.virtualStages, has(self.model.preset) ? {_LAYERS_CEL}[self.model.preset] : self.model.layers])",
            field_path=".pipeline.stages",
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
            rule="!has(self.scheduling.gangMinMembers) || self.scheduling.gangMinMembers <= self.pipeline.stages * self.pipeline.dataParallel",
            message="spec.scheduling.gangMinMembers cannot exceed the job's pods (stages × dataParallel)",
            field_path=".scheduling.gangMinMembers",
        ),
    )


@dataclass
class PipelineTrainingJobStatus:
    """Observed state, written by the operator (or by `pipefill local`)."""

    phase: str = field(
        doc="Pending, Running, Restarting, Succeeded, Failed or Suspended.", max_length=32, default="Pending"
    )
    conditions: list[Condition] = field(
        doc="Created, Running, Restarting, Succeeded, Failed, Suspended, InvalidSpec.",
        max_items=16,
        default_factory=list,
    )
    ranks_ready: int = field(doc="Ranks whose trainer runs.", minimum=0, default=0)
    current_step: int = field(doc="Last completed optimizer step.", minimum=0, default=0)
    bubble_fraction: float | None = field(
        doc="Idle time ÷ step time, mean over ranks.", minimum=0, maximum=1, default=None
    )
    fill_utilization: float | None = field(
        doc="Fill busy time ÷ bubble time (bubble recovery).", minimum=0, default=None
    )
    restarts: int = field(doc="Whole-job restarts so far.", minimum=0, default=0)
    start_time: str | None = field(doc="When the job started running.", fmt="date-time", default=None)
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
