"""What admission accepts but the operator refuses, through the trainer's own schedule builder, and the warning
about checkpoints a restarted gang would not find."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipefill.lifecycle.checks import checkpoint_sharing, spec_problems
from pipefill.spec import PipelineTrainingJob, load_training_job, parse, to_obj

ROOT = Path(__file__).resolve().parents[2]


def _job(**pipeline: Any) -> PipelineTrainingJob:
    obj = to_obj(load_training_job(ROOT / "examples" / "cpu-demo.yaml"))
    obj["spec"]["pipeline"].update(pipeline)
    job = parse(obj)
    assert isinstance(job, PipelineTrainingJob)
    return job


def test_the_examples_pass() -> None:
    for name in ("cpu-demo", "gpu-interleaved", "gpu-nodes"):
        assert spec_problems(load_training_job(ROOT / "examples" / f"{name}.yaml")) == []


def test_schedule_rules_come_from_the_trainers_shape_derivation() -> None:
    # admission (CEL) refuses 1f1b with fewer microbatches than stages; the operator's own check holds it too, for
    # objects that bypassed admission (defence in depth)
    job = _job(stages=4, microbatches=4, globalBatch=8)
    job.spec.pipeline.microbatches = 2
    (problem,) = spec_problems(job)
    assert problem.startswith("spec.pipeline.microbatches: Invalid value: 2: schedule '1f1b' needs")


def test_custom_schedule_is_checked_once_its_csv_is_there() -> None:
    job = _job(schedule="custom", customSchedule={"name": "s"})
    assert spec_problems(job) == []  # waits for the ConfigMap instead
    good = "0F0,0F1,0B0,0B1\n"
    assert spec_problems(job, schedule_csv="0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n") == []
    (problem,) = spec_problems(job, schedule_csv=good)
    assert problem.startswith("spec.pipeline.customSchedule: Invalid value: null:")


def test_layers_per_stage_must_sum_to_the_models_layers() -> None:
    job = _job()  # the loader refuses the cut too; the operator checks objects that bypassed it
    job.spec.pipeline.layers_per_stage = [1, 2]
    (problem,) = spec_problems(job)
    assert "spec.pipeline.layersPerStage: Invalid value: [1, 2]" in problem and "model's 4 layers" in problem


def test_visible_devices_shares_one_gpu_per_rank_and_overlay_collisions_are_problems() -> None:
    obj = to_obj(load_training_job(ROOT / "examples" / "gpu-nodes.yaml"))
    obj["spec"]["podTemplate"]["labels"]["pipefill.io/rank"] = "x"
    job = parse(obj)
    assert isinstance(job, PipelineTrainingJob)
    job.spec.resources.gpus = 2  # admission (CEL) refuses it; the operator holds it for objects that bypassed it
    problems = spec_problems(job)
    assert [p.split(":")[0] for p in problems] == ["spec.resources.gpus", "spec.podTemplate.labels['pipefill.io/rank']"]


@pytest.mark.parametrize(
    ("claim_name", "claim", "world", "shared", "reason"),
    [
        (None, None, 2, False, "CheckpointsNotShared"),
        ("c", None, 2, False, "CheckpointClaimMissing"),
        ("c", {"spec": {"accessModes": ["ReadWriteOnce"]}}, 2, False, "CheckpointsNotShared"),
        ("c", {"spec": {"accessModes": ["ReadWriteOnce"]}}, 1, True, "SharedVolume"),
        ("c", {"spec": {"accessModes": ["ReadWriteMany"]}}, 2, True, "SharedVolume"),
    ],
)
def test_checkpoint_sharing(
    claim_name: str | None, claim: dict[str, Any] | None, world: int, shared: bool, reason: str
) -> None:
    obj = to_obj(load_training_job(ROOT / "examples" / "cpu-demo.yaml"))
    obj["spec"]["pipeline"]["stages"] = world
    obj["spec"]["checkpoint"]["claimName"] = claim_name
    if claim_name is None:
        del obj["spec"]["checkpoint"]["claimName"]
    job = parse(obj)
    assert isinstance(job, PipelineTrainingJob)
    got = checkpoint_sharing(job, claim)
    assert got[:2] == (shared, reason)
