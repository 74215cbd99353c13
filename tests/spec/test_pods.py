"""Rank pods built from the examples are valid Kubernetes Pods with the container layout the design promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from pipefill import env
from pipefill.pods import rank_containers, rank_pod
from pipefill.spec import PipelineTrainingJob, load_file, parse, to_obj

ROOT = Path(__file__).resolve().parents[2]
JOBS = [
    m for p in sorted((ROOT / "examples").glob("*.yaml")) for m in load_file(p) if isinstance(m, PipelineTrainingJob)
]


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.name)
def test_every_rank_pod_is_a_valid_pod(job: PipelineTrainingJob) -> None:
    for rank in range(job.world_size):
        kubernetes_validate.validate(rank_pod(job, rank), "1.34", strict=True)


def test_gpu_job_shares_one_dra_claim_and_runs_fill_as_native_sidecar() -> None:
    job = next(j for j in JOBS if j.name == "gpt-1-3b")
    pod = rank_pod(job, 9)
    (trainer,) = pod["spec"]["containers"]
    (fill,) = pod["spec"]["initContainers"]
    assert fill["restartPolicy"] == "Always"
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpt-1-3b-gpu"}]
    assert trainer["resources"]["claims"] == fill["resources"]["claims"] == [{"name": "gpu"}]
    assert pod["metadata"]["labels"]["pipefill.io/stage"] == "1"
    assert pod["metadata"]["labels"]["pipefill.io/replica"] == "1"
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    # rank environment only in the trainer; the API token only in the fill executor
    assert _env(trainer)["RANK"] == "9" and _env(trainer)["WORLD_SIZE"] == "16"
    assert "RANK" not in _env(fill) and _env(fill)[env.RANK] == "9"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert any(m["name"] == "api-token" for m in fill["volumeMounts"])
    assert not any(m["name"] == "api-token" for m in trainer["volumeMounts"])
    assert _env(fill)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=12288M"
    assert _env(fill)["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    shared = {m["mountPath"] for m in trainer["volumeMounts"]} & {m["mountPath"] for m in fill["volumeMounts"]}
    assert env.DEFAULT_CHANNEL_DIR in shared


def test_visible_devices_fallback_requests_the_gpu_for_the_trainer_only() -> None:
    obj = to_obj(next(j for j in JOBS if j.name == "gpt-1-3b"))
    obj["spec"]["gpuSharing"]["mode"] = "visibleDevices"
    job = parse(obj)
    assert isinstance(job, PipelineTrainingJob)
    pod = rank_pod(job, 0)
    trainer, fill = pod["spec"]["containers"][0], pod["spec"]["initContainers"][0]
    assert trainer["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "limits" not in fill["resources"] and _env(fill)["NVIDIA_VISIBLE_DEVICES"] == "all"
    kubernetes_validate.validate(pod, "1.34", strict=True)


def test_fill_disabled_means_no_sidecar_and_rank_out_of_range_is_refused() -> None:
    obj = to_obj(next(j for j in JOBS if j.name == "cpu-demo"))
    obj["spec"]["fill"]["enabled"] = False
    job = parse(obj)
    assert isinstance(job, PipelineTrainingJob)
    assert [c.name for c in rank_containers(job, 1)] == ["trainer"]
    assert "initContainers" not in rank_pod(job, 1)["spec"]
    with pytest.raises(ValueError, match=r"rank 2 is outside 0\.\.1"):
        rank_containers(job, 2)
