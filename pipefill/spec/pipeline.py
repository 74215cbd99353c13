"""How the model is cut into stages and in which order microbatches flow through them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from pipefill.spec._schema import Rule, field
from pipefill.spec.immutable import WORLD_SIZE_FIXED, immutable

__all__ = ["ConfigMapKey", "Pipeline", "Schedule"]

_RESHARD = "delete the job and create it again (checkpoints of format dcp reshard onto the new layout)"


class Schedule(enum.StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZERO_BUBBLE_H1 = "zero-bubble-h1"
    ZBV = "zbv"
    CUSTOM = "custom"


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
        # Sizes every part of the product handles in seconds: a step's schedule has stages × virtualStages ×
        # microbatches × 2–3 actions, and validating it (the deadlock check) and predicting its bubbles (the fill
        # queue) grow with them — 32 stages × 65 536 microbatches took 98 s and 1.8 GB to validate, more than the
        # operator's memory limit. A job's rank pods are bounded by what one cluster runs.
        Rule(
            rule="self.stages * self.virtualStages * self.microbatches <= 65536",
            message="spec.pipeline: stages × virtualStages × microbatches must not exceed 65536",
            message_expression="'spec.pipeline: stages × virtualStages × microbatches = %d exceeds 65536: the"
            " schedule of a step grows with it, and validating and predicting it would take minutes and gigabytes;"
            " use fewer, larger microbatches or fewer stages'.format([self.stages * self.virtualStages *"
            " self.microbatches])",
            field_path=".microbatches",
        ),
        Rule(
            rule="self.stages * self.dataParallel <= 65536",
            message="spec.pipeline: stages × dataParallel (the job's rank pods) must not exceed 65536",
            message_expression="'spec.pipeline: stages × dataParallel = %d rank pods exceeds 65536, more than one"
            " cluster runs; use fewer data-parallel replicas'.format([self.stages * self.dataParallel])",
            field_path=".dataParallel",
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
        immutable("stages", path="spec.pipeline.stages", why=WORLD_SIZE_FIXED, instead=_RESHARD),
        immutable("dataParallel", path="spec.pipeline.dataParallel", why=WORLD_SIZE_FIXED, instead=_RESHARD),
    )


@dataclass
class ConfigMapKey:
    """A key of a ConfigMap in the job's namespace."""

    name: str = field(doc="ConfigMap name.", max_length=253)
    key: str = field(doc="Key inside the ConfigMap.", max_length=253, default="schedule.csv")
