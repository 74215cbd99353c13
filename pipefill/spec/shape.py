"""The pipeline's shape, derived from a job in one place: the microbatch size and the schedule.

Every consumer takes them from here — the trainer, ``pipefill simulate``, the benchmarks, admission
(:func:`pipefill.spec.loader.validate` runs :func:`shape_errors`) and the operator — so the fact "a microbatch holds
globalBatch ÷ (microbatches × dataParallel) samples" and the schedule's own rules live once. ``tests/structure`` walks
the source and fails if another module divides the global batch or builds a schedule from a spec.

Errors name the field (``spec.pipeline.microbatches``), its value, the rule and the fix, as the API server's do. A
command that takes the same numbers as flags (``pipefill simulate --microbatches``) passes its own :class:`ShapeNames`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pipefill.schedules import Schedule, ScheduleError, ScheduleRuleError, build_schedule, canonical_name
from pipefill.spec.training import PipelineTrainingJob
from pipefill.spec.validation import FieldError

__all__ = ["SPEC_NAMES", "PipelineShape", "ShapeError", "ShapeNames", "derive_shape", "from_spec", "shape_errors"]


@dataclass(frozen=True)
class ShapeNames:
    """How messages name each input of the shape: a spec's field paths, or a command's flags."""

    schedule: str
    stages: str
    microbatches: str
    virtual_stages: str
    global_batch: str
    data_parallel: str
    microbatch_size: str
    custom_schedule: str

    def for_schedules(self) -> dict[str, str]:
        """The names :class:`~pipefill.schedules.ScheduleRuleError` renders its parameters with."""
        return {"ranks": self.stages, "microbatches": self.microbatches, "virtual_stages": self.virtual_stages}


SPEC_NAMES = ShapeNames(
    schedule="spec.pipeline.schedule",
    stages="spec.pipeline.stages",
    microbatches="spec.pipeline.microbatches",
    virtual_stages="spec.pipeline.virtualStages",
    global_batch="spec.pipeline.globalBatch",
    data_parallel="spec.pipeline.dataParallel",
    microbatch_size="the microbatch size",
    custom_schedule="spec.pipeline.customSchedule",
)


class ShapeError(ValueError):
    """The shape cannot be derived; ``errors`` holds the violation (field path and message)."""

    def __init__(self, error: FieldError) -> None:
        self.errors = [error]
        super().__init__(error.text)


@dataclass(frozen=True)
class PipelineShape:
    """What a pipeline looks like per step: its schedule (ranks, stages, action orders) and how the batch is cut."""

    schedule: Schedule
    microbatch_size: int
    """samples per microbatch"""
    data_parallel: int
    """pipeline replicas"""

    @property
    def stages(self) -> int:
        """pipeline ranks ``p``"""
        return self.schedule.num_ranks

    @property
    def microbatches(self) -> int:
        """``m`` per step per replica"""
        return self.schedule.num_microbatches

    @property
    def replica_batch(self) -> int:
        """samples per step of one replica: microbatches × microbatch size"""
        return self.microbatches * self.microbatch_size

    @property
    def global_batch(self) -> int:
        """samples per step over all replicas"""
        return self.replica_batch * self.data_parallel


def _field_error(path: str, value: object, text: str, rule: str) -> FieldError:
    return FieldError(path, f"{path}: Invalid value: {json.dumps(value)}: {text} [rule: {rule}]")


def _invalid(path: str, value: object, text: str, rule: str) -> ShapeError:
    return ShapeError(_field_error(path, value, text, rule))


def _batch_split(
    *,
    global_batch: int | None,
    data_parallel: int,
    microbatches: int | None,
    microbatch_size: int | None,
    n: ShapeNames,
) -> tuple[int, int]:
    """(microbatches, microbatch size) from whichever two of global batch, microbatches, microbatch size are given."""
    if microbatches is not None and (global_batch is None or microbatch_size is not None):
        return microbatches, microbatch_size or 1
    if global_batch is None:
        raise _invalid(
            n.microbatches, None, f"{n.microbatches} is required, or {n.global_batch} to derive it", "required"
        )
    per = data_parallel * (microbatches if microbatches is not None else microbatch_size or 1)
    quotient, rest = divmod(global_batch, per)
    if rest or quotient < 1:
        what = f"{n.microbatches} × {n.data_parallel}" if microbatches is not None else "microbatch size × replicas"
        fit = (global_batch // per + 1) * per
        raise _invalid(
            n.global_batch,
            global_batch,
            f"{n.global_batch} {global_batch} is not divisible by {what} = {per}; use a multiple such as {fit}",
            f"{n.global_batch} % ({what}) == 0",
        )
    return (microbatches, quotient) if microbatches is not None else (quotient, microbatch_size or 1)


def derive_shape(
    *,
    schedule: str,
    stages: int,
    microbatches: int | None = None,
    global_batch: int | None = None,
    data_parallel: int = 1,
    microbatch_size: int | None = None,
    virtual_stages: int | None = None,
    csv_text: str | None = None,
    names: ShapeNames = SPEC_NAMES,
) -> PipelineShape:
    """The shape from plain numbers; two of ``global_batch``, ``microbatches`` and ``microbatch_size`` settle the
    third. Raises :class:`ShapeError` naming the input (as ``names`` says) that breaks a rule."""
    m, mbs = _batch_split(
        global_batch=global_batch,
        data_parallel=data_parallel,
        microbatches=microbatches,
        microbatch_size=microbatch_size,
        n=names,
    )
    if virtual_stages == 1 and csv_text is not None:
        virtual_stages = None  # the default: a custom schedule's CSV says how many stages each rank holds
    try:
        built = build_schedule(schedule, ranks=stages, microbatches=m, virtual_stages=virtual_stages, csv_text=csv_text)
    except ScheduleRuleError as exc:
        path = names.for_schedules()[exc.param]
        rule = exc.rendered_rule(names.for_schedules())
        raise _invalid(path, exc.value, exc.render(names.for_schedules()), rule) from None
    except ScheduleError as exc:  # the CSV of schedule custom
        raise _invalid(names.custom_schedule, None, str(exc), "a schedule every action of which can run") from None
    except ValueError as exc:  # an unknown schedule name, or a CSV where none belongs
        raise _invalid(names.schedule, schedule, str(exc), "a known schedule") from None
    return PipelineShape(schedule=built, microbatch_size=mbs, data_parallel=data_parallel)


def from_spec(job: PipelineTrainingJob, *, schedule_csv: str | None = None) -> PipelineShape:
    """The job's shape; ``schedule_csv`` is the CSV of ``schedule: custom`` (from its ConfigMap)."""
    pipe = job.spec.pipeline
    if pipe.schedule == "custom" and schedule_csv is None:
        raise _invalid(
            SPEC_NAMES.custom_schedule,
            None,
            "schedule custom is built from its CSV; pass the ConfigMap key's content",
            "customSchedule CSV present",
        )
    return derive_shape(
        schedule=str(pipe.schedule),
        stages=pipe.stages,
        microbatches=pipe.microbatches,
        global_batch=pipe.global_batch,
        data_parallel=pipe.data_parallel,
        virtual_stages=pipe.virtual_stages,
        csv_text=schedule_csv,
    )


def shape_errors(job: PipelineTrainingJob) -> list[FieldError]:
    """What admission adds to the schema and CEL: the schedule's own rules and the layer cut's, as field errors.

    A custom schedule's CSV lives in a ConfigMap admission does not see: its rules are checked where it is read.
    """
    pipe = job.spec.pipeline
    errors: list[FieldError] = []
    if job.spec.trainer is not None:
        return errors  # the command's schedule is its own (spec.trainer)
    if canonical_name(str(pipe.schedule)) != "custom":
        try:
            from_spec(job)
        except ShapeError as exc:
            errors += exc.errors
    cut = pipe.layers_per_stage
    if job.spec.model.hugging_face is not None or job.spec.model.python is not None:
        return errors  # its layers are the model's (config.json, provider): the trainer checks the cut at start
    layers, _, _ = job.spec.model.dims()  # CEL checked layers ≥ stages × virtualStages and the cut's length
    if cut is not None and (min(cut) < 1 or sum(cut) != layers):
        errors.append(
            _field_error(
                "spec.pipeline.layersPerStage",
                cut,
                f"needs every entry ≥ 1 and their sum equal to the model's {layers} layers, sums to {sum(cut)}; "
                "fix the list or remove it to balance the stages by cost",
                "sum(layersPerStage) == layers && min(layersPerStage) >= 1",
            )
        )
    return errors
