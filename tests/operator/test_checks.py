"""What admission accepts but the operator refuses, through the trainer's own schedule builder, the warning
about checkpoints a restarted gang would not find, and the user's objects the pods mount (waited for when missing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipefill.children import spec_config_name
from pipefill.lifecycle.checks import checkpoint_sharing, spec_problems
from pipefill.lifecycle.volumes import missing_mounts, mounted_objects
from pipefill.pods import rank_pod
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


def _mounting_job() -> PipelineTrainingJob:
    """A job that mounts everything a user can name: the model's claim, the data's, the fill storage, the
    checkpoint claim."""
    obj = to_obj(load_training_job(ROOT / "examples" / "hf-demo.yaml"))
    obj["spec"]["model"]["huggingFace"].update(path="/models/llama", claimName="weights")
    obj["spec"]["data"].update(path="/data/corpus.txt", claimName="corpus")
    obj["spec"]["fill"]["storage"] = {"claimName": "shared"}
    obj["spec"]["checkpoint"]["claimName"] = "ckpt"
    job = parse(obj)
    assert isinstance(job, PipelineTrainingJob)
    return job


def _pod_mounts(job: PipelineTrainingJob) -> set[tuple[str, str]]:
    """The ConfigMaps and claims the rank pod mounts, but for the operator's own (the spec ConfigMap, the API's CA)
    and the checkpoint claim (waited for with its access-mode check)."""
    own = {("ConfigMap", "kube-root-ca.crt"), ("ConfigMap", spec_config_name(job))}
    if job.spec.checkpoint.claim_name:
        own.add(("PersistentVolumeClaim", job.spec.checkpoint.claim_name))
    out = set()
    for volume in rank_pod(job, 0)["spec"]["volumes"]:
        sources = [volume, *((volume.get("projected") or {}).get("sources") or ())]
        for source in sources:
            if "configMap" in source:
                out.add(("ConfigMap", source["configMap"]["name"]))
            if "persistentVolumeClaim" in source:
                out.add(("PersistentVolumeClaim", source["persistentVolumeClaim"]["claimName"]))
    return out - own


def test_the_objects_waited_for_are_the_ones_the_pods_mount() -> None:
    # one list in the core (volumes.py) and one in the pod builder (pods.py): a volume added to the pod and not to
    # the list would let pods hang in ContainerCreating again
    jobs = [_mounting_job(), load_training_job(ROOT / "examples" / "user-model" / "job.yaml")]
    for path in ("hf-demo", "cpu-demo"):
        jobs.append(load_training_job(ROOT / "examples" / f"{path}.yaml"))
    config_map_job = _mounting_job()
    hf = config_map_job.spec.model.hugging_face
    assert hf is not None
    hf.claim_name, hf.config_map = None, "llama-config"
    jobs.append(config_map_job)
    for job in jobs:
        assert {(m.kind, m.name) for m in mounted_objects(job)} == _pod_mounts(job), job.metadata.name
    fields = [m.field for m in mounted_objects(_mounting_job())]
    assert fields == ["spec.model.huggingFace.claimName", "spec.data.claimName", "spec.fill.storage.claimName"]


def test_missing_mounts_name_the_field_the_object_and_the_fix() -> None:
    job = _mounting_job()
    hf = job.spec.model.hugging_face
    assert hf is not None
    hf.claim_name, hf.config_map = None, "llama-config"
    needed = mounted_objects(job)
    claim = {"metadata": {"name": "x"}, "spec": {}}
    assert missing_mounts(needed, [{"data": {"config.json": "{}"}}, claim, claim]) is None
    got = missing_mounts(needed, [None, claim, claim])
    assert got is not None
    missing, (reason, message) = got
    assert [m.name for m in missing] == ["llama-config"] and reason == "ConfigMapMissing"
    assert message == (
        "ConfigMap 'llama-config' (spec.model.huggingFace.configMap) does not exist: create it (kubectl create "
        "configmap llama-config --from-file=...) or correct spec.model.huggingFace.configMap; the job starts once it "
        "is there"
    )
    # a ConfigMap without config.json mounts fine and the trainer would fail at every start: waited for as well
    got = missing_mounts(needed, [{"data": {"tokenizer.json": "{}"}}, None, claim])
    assert got is not None
    missing, (reason, message) = got
    assert [m.name for m in missing] == ["llama-config", "corpus"] and reason == "ConfigMapMissing"
    assert "has no key config.json (its keys: tokenizer.json): add the model's config.json to it" in message
    assert "PersistentVolumeClaim 'corpus' (spec.data.claimName) does not exist" in message
    assert message.endswith("the job starts once they are all there")
