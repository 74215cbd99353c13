"""One pipeline shape: ``from_spec`` derives the microbatch size and the schedule as the trainer uses them, and
``pipefill validate`` applies the schedule's own rules with errors naming the field, the value, the rule and the fix."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipefill.cli import main
from pipefill.schedules import build_schedule, dump_csv
from pipefill.spec import PipelineTrainingJob, SpecError, parse
from pipefill.spec.shape import SPEC_NAMES, ShapeError, ShapeNames, derive_shape, from_spec

JOB: dict[str, Any] = {
    "apiVersion": "pipefill.io/v1alpha1",
    "kind": "PipelineTrainingJob",
    "metadata": {"name": "shape"},
    "spec": {
        "model": {"layers": 8, "hiddenSize": 64, "heads": 4, "seqLen": 16, "vocabSize": 256},
        "pipeline": {"stages": 4, "microbatches": 8, "globalBatch": 32, "dataParallel": 2},
    },
}


def _job(**pipeline: Any) -> dict[str, Any]:
    doc = copy.deepcopy(JOB)
    doc["spec"]["pipeline"].update(pipeline)
    return doc


def _typed(**pipeline: Any) -> PipelineTrainingJob:
    job = parse(_job(**pipeline))
    assert isinstance(job, PipelineTrainingJob)
    return job


def test_from_spec_derives_the_microbatch_size_and_the_schedule_the_trainer_runs() -> None:
    shape = from_spec(_typed(schedule="interleaved-1f1b", virtualStages=2))
    assert (shape.microbatch_size, shape.microbatches, shape.data_parallel) == (2, 8, 2)  # 32 ÷ (8 × 2)
    assert (shape.stages, shape.replica_batch, shape.global_batch) == (4, 16, 32)
    assert shape.schedule == build_schedule("interleaved-1f1b", ranks=4, microbatches=8, virtual_stages=2)


def test_a_custom_schedule_is_built_from_its_csv_and_admission_leaves_the_csv_to_the_trainer() -> None:
    job = _typed(schedule="custom", customSchedule={"name": "plan"}, virtualStages=2)
    with pytest.raises(ShapeError, match=r"spec.pipeline.customSchedule: .*built from its CSV"):
        from_spec(job)
    csv_text = dump_csv(build_schedule("zbv", ranks=4, microbatches=8))
    assert from_spec(job, schedule_csv=csv_text).schedule.placement_style == "v"
    with pytest.raises(ShapeError, match=r"spec.pipeline.customSchedule: .*2 rows but the pipeline has 4 ranks"):
        from_spec(job, schedule_csv="0F0,0B0\n1F0,1B0\n")


@pytest.mark.parametrize(
    ("pipeline", "field", "value", "rule", "fix"),
    [
        (
            {"schedule": "1f1b", "microbatches": 2, "globalBatch": 8},
            "spec.pipeline.microbatches",
            "2",
            # held by a CEL rule in the CRD: admission and pipefill validate say the same
            "self.schedule != '1f1b' || self.microbatches >= self.stages",
            "raise microbatches or use gpipe",
        ),
        (
            {"schedule": "zero-bubble-h1", "virtualStages": 2, "microbatches": 9, "globalBatch": 18},
            "spec.pipeline.microbatches",
            "9",
            "!(self.schedule in ['interleaved-1f1b', 'zero-bubble-h1']) || self.microbatches % (self.microbatches"
            " / self.stages > 1 ? self.microbatches / self.stages : 1) == 0",
            "use a multiple of stages (4)",
        ),
        (
            {"schedule": "gpipe", "layersPerStage": [1, 2, 2, 2]},
            "spec.pipeline.layersPerStage",
            "[1, 2, 2, 2]",
            "sum(layersPerStage) == layers && min(layersPerStage) >= 1",
            "their sum equal to the model's 8 layers, sums to 7",
        ),
    ],
)
def test_admission_applies_the_schedules_rules_naming_field_value_rule_and_fix(
    pipeline: dict[str, Any], field: str, value: str, rule: str, fix: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse(_job(**pipeline))
    (error,) = info.value.errors
    assert error.path == field
    assert error.text.startswith(f"{field}: Invalid value: {value}: ")
    assert error.text.endswith(f"[rule: {rule}]") and fix in error.text


def test_pipefill_validate_rejects_what_the_trainer_would_reject_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump(_job(schedule="1f1b")))
    bad.write_text(yaml.safe_dump(_job(schedule="1f1b", microbatches=2, globalBatch=8)))
    assert main(["validate", "-f", str(good)]) == 0
    assert main(["validate", "-f", str(bad)]) == 1
    err = capsys.readouterr().err
    assert 'PipelineTrainingJob "shape" is invalid' in err
    assert (
        "spec.pipeline.microbatches: Invalid value: 2: spec.pipeline.microbatches 2 is fewer than the 4 stages" in err
    )


def test_the_shape_module_holds_the_schedule_rules_admission_also_holds() -> None:
    """Defence in depth: what the CRD's CEL rules refuse, the shape (the trainer's own path) refuses too."""
    with pytest.raises(ShapeError, match=r"^spec.pipeline.microbatches: Invalid value: 2: schedule '1f1b' needs"):
        derive_shape(schedule="1f1b", stages=4, microbatches=2, names=SPEC_NAMES)
    with pytest.raises(ShapeError, match=r"^spec.pipeline.microbatches: Invalid value: 9: .*multiple of the rounds"):
        derive_shape(schedule="zero-bubble-h1", stages=4, microbatches=9, virtual_stages=2, names=SPEC_NAMES)


def test_plain_numbers_settle_the_third_batch_figure_and_errors_use_the_callers_names() -> None:
    flags = ShapeNames(*(f"--{n}" for n in ("s", "p", "m", "v", "gb", "dp", "mbs", "csv")))
    assert derive_shape(schedule="gpipe", stages=2, microbatches=4, global_batch=16).microbatch_size == 4
    assert derive_shape(schedule="gpipe", stages=2, global_batch=16, microbatch_size=2).microbatches == 8
    assert derive_shape(schedule="gpipe", stages=2, microbatches=4).microbatch_size == 1
    with pytest.raises(ShapeError, match=r"^--gb: Invalid value: 10: --gb 10 is not divisible by --m × --dp = 8"):
        derive_shape(schedule="gpipe", stages=2, microbatches=4, global_batch=10, data_parallel=2, names=flags)
    with pytest.raises(ShapeError, match=r"^--v: Invalid value: 3: schedule 'zbv' holds exactly 2 stages"):
        derive_shape(schedule="zbv", stages=2, microbatches=4, virtual_stages=3, names=flags)
    with pytest.raises(ShapeError, match=r"^spec.pipeline.microbatches: .* is required"):
        derive_shape(schedule="gpipe", stages=2, names=SPEC_NAMES)
