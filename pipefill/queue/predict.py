"""Bubble classes of a rank that has reported none yet: the timeline simulator's prediction from the training spec.

A rank's executor reports its measured bubble classes once bubbles arrive; until then the queue plans with the
simulator's bubbles for that pipeline rank (the job's shape from ``pipefill.spec.shape`` + ``Costs.analytic`` + ``MemoryModel.analytic`` +
``simulate``, the same as ``pipefill simulate -f``): an H100-class device (989 TFLOP/s at 45 % MFU, 80 GiB), bubbles
shorter than ``spec.fill.minBubbleMilliseconds`` dropped (they are never announced), free memory capped at
``spec.fill.reservedMemory`` (the most the fill may allocate). Absolute times are those of that device, also for a
job that trains elsewhere (CPU): the prediction only ranks jobs until measured classes replace it. Results are cached
per spec shape, so a pass over many ranks of equal jobs simulates each shape once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pipefill.env import AUTO_MIN_BUBBLE_MS
from pipefill.plan import BubbleClass, ObservedBubble, classes_from_bubbles
from pipefill.schedules import Costs, MemoryModel, simulate
from pipefill.spec import PipelineTrainingJobSpec, parse_bytes
from pipefill.spec.shape import PipelineShape, derive_shape

__all__ = ["DEVICE_BYTES", "DEVICE_TFLOPS", "PredictedRank", "predict_ranks"]

DEVICE_TFLOPS = 989.0
"""Peak dense bf16 TFLOP/s the prediction assumes (H100 SXM); default of ``pipefill simulate``."""
DEVICE_BYTES = 80 << 30
"""Device memory the prediction assumes, bytes (H100 80 GB)."""
_MFU = 0.45
_VOCAB_DEFAULT = 50304


@dataclass(frozen=True)
class PredictedRank:
    """One pipeline rank's predicted bubble classes (per training step) and the step time."""

    classes: tuple[BubbleClass, ...]
    step_s: float


def predict_ranks(spec: PipelineTrainingJobSpec, *, schedule_csv: str | None = None) -> tuple[PredictedRank, ...]:
    """One :class:`PredictedRank` per pipeline rank (``stages`` entries; a pod's global rank ``g`` is pipeline rank
    ``g % stages``). ``schedule_csv``: the custom schedule's CSV (schedule ``custom`` needs it)."""
    pipe, model = spec.pipeline, spec.model
    layers, hidden, _heads = model.dims()
    if pipe.schedule.value == "custom" and schedule_csv is None:
        raise ValueError("spec.pipeline.schedule custom: the prediction needs the schedule's CSV (customSchedule)")
    shape_key = (
        pipe.schedule.value,
        pipe.stages,
        pipe.microbatches,
        pipe.global_batch,
        pipe.virtual_stages,
        pipe.data_parallel,
        schedule_csv,
    )
    mbs = _shape(*shape_key).microbatch_size  # ShapeError (a ValueError) names the field that breaks a rule
    key = (
        shape_key,
        pipe.activation_checkpointing,
        layers,
        hidden,
        model.seq_len * mbs,
        model.vocab_size,
        model.tied_embeddings,
        parse_bytes(spec.fill.reserved_memory, field="spec.fill.reservedMemory"),
        _min_bubble_ms(spec) / 1e3,
    )
    return _predict(*key)


def _min_bubble_ms(spec: PipelineTrainingJobSpec) -> float:
    """The announcement floor the queue plans with: the spec's, or — unset, where each executor measures its own —
    the floor a trainer uses before its executor has said one."""
    ms = spec.fill.min_bubble_milliseconds
    return AUTO_MIN_BUBBLE_MS if ms is None else ms


@functools.lru_cache(maxsize=256)
def _shape(
    schedule_name: str,
    stages: int,
    microbatches: int,
    global_batch: int,
    virtual_stages: int,
    data_parallel: int,
    schedule_csv: str | None,
) -> PipelineShape:
    """The job's shape from :mod:`pipefill.spec.shape` (its one home), cached per spec shape."""
    return derive_shape(
        schedule=schedule_name,
        stages=stages,
        microbatches=microbatches,
        global_batch=global_batch,
        data_parallel=data_parallel,
        virtual_stages=virtual_stages,
        csv_text=schedule_csv,
    )


@functools.lru_cache(maxsize=256)
def _predict(
    shape_key: tuple[str, int, int, int, int, int, str | None],
    checkpointing: bool,
    layers: int,
    hidden: int,
    tokens_per_mb: int,
    vocab: int,
    tied: bool,
    reserved_bytes: int,
    min_bubble_s: float,
) -> tuple[PredictedRank, ...]:
    schedule = _shape(*shape_key).schedule
    data_parallel = shape_key[5]
    params = 12 * layers * hidden * hidden + (vocab or _VOCAB_DEFAULT) * hidden * (1 if tied else 2)
    costs = Costs.analytic(
        params=params,
        tokens_per_mb=tokens_per_mb,
        stages=schedule.num_stages,
        device_tflops=DEVICE_TFLOPS,
        layers=layers,
        hidden_size=hidden,
        mfu=_MFU,
        data_parallel=data_parallel,
        virtual_stages=schedule.virtual_stages,
        activation_checkpointing=checkpointing,
    )
    memory = MemoryModel.analytic(
        params=params,
        stages=schedule.num_stages,
        layers=layers,
        hidden_size=hidden,
        tokens_per_mb=tokens_per_mb,
        device_bytes=DEVICE_BYTES,
        activation_checkpointing=checkpointing,
    )
    timeline = simulate(schedule, costs, memory, validate=False)  # the shape validated it
    out = []
    for rank in range(schedule.num_ranks):
        bubbles = [
            ObservedBubble(b.duration_s, max(0, min(reserved_bytes, b.free_bytes or 0)), b.kind)
            for b in timeline.bubbles(rank)
            if b.duration_s >= min_bubble_s
        ]
        classes = classes_from_bubbles(bubbles, default_free_bytes=reserved_bytes)
        out.append(PredictedRank(tuple(classes), timeline.step_s))
    return tuple(out)
