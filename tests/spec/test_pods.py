"""Rank pods built from the examples are valid Kubernetes Pods with the container layout and contract the design
promises (docs/operator.md#the-pod-contract)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pipefill import env
from pipefill.children import SPEC_ANNOTATION, Owner, spec_document
from pipefill.pods import GENERATION_LABEL, SPEC_MOUNT, rank_containers, rank_pod
from pipefill.spec import PipelineTrainingJob, load_file, parse, to_obj

ROOT = Path(__file__).resolve().parents[2]
JOBS = [
    m for p in sorted((ROOT / "examples").glob("*.yaml")) for m in load_file(p) if isinstance(m, PipelineTrainingJob)
]
# The release the test control plane runs (pods of gang: kubernetes carry spec.schedulingGroup, new in 1.35).
K8S = "1.36"


def _job(name: str, **changes: Any) -> PipelineTrainingJob:
    obj = to_obj(next(j for j in JOBS if j.name == name))
    for dotted, value in changes.items():
        node = obj
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    job = parse(obj)
    assert isinstance(job, PipelineTrainingJob)
    return job


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _containers(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    (trainer,) = pod["spec"]["containers"]
    (fill,) = pod["spec"]["initContainers"]
    return trainer, fill


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.name)
def test_every_rank_pod_is_a_valid_pod(job: PipelineTrainingJob) -> None:
    for rank in range(job.world_size):
        kubernetes_validate.validate(rank_pod(job, rank, generation=3), K8S, strict=True)


def test_gpu_job_shares_one_dra_claim_and_runs_fill_as_native_sidecar() -> None:
    job = next(j for j in JOBS if j.name == "gpt-1-3b")
    pod = rank_pod(job, 9)
    trainer, fill = _containers(pod)
    assert fill["restartPolicy"] == "Always"
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpt-1-3b-gpu"}]
    assert trainer["resources"]["claims"] == fill["resources"]["claims"] == [{"name": "gpu"}]
    assert pod["metadata"]["labels"]["pipefill.io/stage"] == "1"
    assert pod["metadata"]["labels"]["pipefill.io/replica"] == "1"
    # rank environment only in the trainer; the API token only in the fill executor
    assert _env(trainer)["RANK"] == "9" and _env(trainer)["WORLD_SIZE"] == "16"
    assert "RANK" not in _env(fill) and _env(fill)[env.RANK] == "9"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert any(m["name"] == "api-token" for m in fill["volumeMounts"])
    assert not any(m["name"] == "api-token" for m in trainer["volumeMounts"])
    # MPS caps stay per container: the fill's environment, never the shared claim
    assert _env(fill)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=12288M"
    assert _env(fill)["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in _env(trainer)
    shared = {m["mountPath"] for m in trainer["volumeMounts"]} & {m["mountPath"] for m in fill["volumeMounts"]}
    assert env.DEFAULT_CHANNEL_DIR in shared


def test_pod_contract_security_context_and_writable_scratch() -> None:
    job = _job("cpu-demo", **{"spec.runPolicy.terminationGracePeriodSeconds": 600})
    pod = rank_pod(job, 1, namespace="team-a", generation=2, owner=Owner(name="cpu-demo", uid="u-1"))
    spec = pod["spec"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["terminationGracePeriodSeconds"] == 600
    assert spec["serviceAccountName"] == "pipefill-fill"
    assert pod["metadata"]["labels"][GENERATION_LABEL] == "2"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    trainer, fill = _containers(pod)
    for container in (trainer, fill):
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
        paths = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/tmp", "/home/pipefill", "/workspace/runs"} <= paths  # writable on a read-only root
        assert "/workspace" not in paths  # what the image ships at its working directory stays visible
        assert _env(container)["HOME"] == "/home/pipefill"
    # each container its own /dev/shm, tmp and home
    by_path = {c["name"]: {m["mountPath"]: m["name"] for m in c["volumeMounts"]} for c in (trainer, fill)}
    for path in ("/dev/shm", "/tmp", "/home/pipefill"):
        assert by_path["trainer"][path] != by_path["fill-executor"][path]
    assert [p["name"] for p in trainer["ports"]] == ["trainer-metrics"]
    assert [p["name"] for p in fill["ports"]] == ["fill-metrics"]
    assert fill["resources"]["requests"] == {"cpu": "1", "memory": "4Gi"}
    volumes = {v["name"] for v in spec["volumes"]}
    mounted = {m["name"] for c in (trainer, fill) for m in c["volumeMounts"]}
    assert volumes == mounted


def test_rank_zero_declares_the_rendezvous_port_and_custom_schedule_is_named() -> None:
    job = _job(
        "cpu-demo",
        **{"spec.pipeline.schedule": "custom", "spec.pipeline.customSchedule": {"name": "sched", "key": "s.csv"}},
    )
    trainer0, _ = _containers(rank_pod(job, 0))
    trainer1, _ = _containers(rank_pod(job, 1))
    assert [p["name"] for p in trainer0["ports"]] == ["trainer-metrics", "rendezvous"]
    assert [p["name"] for p in trainer1["ports"]] == ["trainer-metrics"]
    assert _env(trainer0)[env.SCHEDULE_FILE] == "/etc/pipefill/s.csv"


def _spec_volume(pod: dict[str, Any]) -> dict[str, Any]:
    trainer, _ = _containers(pod)
    (mount,) = [m for m in trainer["volumeMounts"] if m["mountPath"] == SPEC_MOUNT]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    return volume


def test_the_trainer_reads_the_spec_from_its_pods_annotation_through_the_downward_api() -> None:
    """No ConfigMap, no request of its own: /etc/pipefill/job.yaml is the pod's annotation, and that is the job."""
    job = _job("cpu-demo")
    pod = rank_pod(job, 1, namespace="team-a")
    trainer, fill = _containers(pod)
    assert _env(trainer)[env.SPEC_FILE] == f"{SPEC_MOUNT}/job.yaml"
    assert _spec_volume(pod) == {
        "name": "spec",
        "downwardAPI": {
            "items": [{"path": "job.yaml", "fieldRef": {"fieldPath": "metadata.annotations['pipefill.io/spec']"}}]
        },
    }
    document = pod["metadata"]["annotations"][SPEC_ANNOTATION]
    assert document == spec_document(job)
    again = parse(yaml.safe_load(document))
    assert isinstance(again, PipelineTrainingJob) and again.spec == job.spec and again.name == job.name
    assert all(m["mountPath"] != SPEC_MOUNT for m in fill["volumeMounts"])  # the trainer's alone, as before
    assert rank_pod(job, 0, document=document) == rank_pod(job, 0)  # a gang's pods can share one document
    kubernetes_validate.validate(pod, K8S, strict=True)


def test_a_custom_schedule_keeps_the_spec_config_map_beside_its_csv() -> None:
    job = _job(
        "cpu-demo",
        **{"spec.pipeline.schedule": "custom", "spec.pipeline.customSchedule": {"name": "sched", "key": "s.csv"}},
    )
    pod = rank_pod(job, 0)
    assert _spec_volume(pod) == {"name": "spec", "configMap": {"name": "cpu-demo-spec"}}
    assert SPEC_ANNOTATION not in pod["metadata"].get("annotations", {})


def test_visible_devices_fallback_requests_the_gpu_for_the_trainer_only() -> None:
    job = _job("gpt-1-3b", **{"spec.gpuSharing.mode": "visibleDevices"})
    pod = rank_pod(job, 0)
    trainer, fill = _containers(pod)
    assert trainer["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "limits" not in fill["resources"] and _env(fill)["NVIDIA_VISIBLE_DEVICES"] == "all"
    kubernetes_validate.validate(pod, K8S, strict=True)


def test_host_network_gives_each_rank_its_own_host_ports() -> None:
    job = next(j for j in JOBS if j.name == "gpt-rdma")
    seen = set()
    for rank in range(job.world_size):
        pod = rank_pod(job, rank)
        assert pod["spec"]["hostNetwork"] is True and pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
        trainer, fill = _containers(pod)
        ports = [(p["containerPort"], p["hostPort"]) for c in (trainer, fill) for p in c["ports"]]
        assert all(a == b for a, b in ports)
        plan = {c.name: c for c in rank_containers(job, rank)}
        assert (
            _env(trainer)[env.METRICS_PORT] == str(plan["trainer"].metrics_port) == str(trainer["ports"][0]["hostPort"])
        )
        metrics = {trainer["ports"][0]["hostPort"], fill["ports"][0]["hostPort"]}
        assert not metrics & seen
        seen |= metrics
        assert _env(trainer)["MASTER_PORT"] == "29500"  # rank 0's rendezvous, where every rank's MASTER_PORT points
    # the node's other listeners: DCGM exporter 9400, node exporter 9100, the operator's metrics 9402 (the chart)
    assert seen == set(range(29501, 29501 + 2 * job.world_size)) and not seen & {9100, 9400, 9402}
    assert [p["hostPort"] for p in _containers(rank_pod(job, 0))[0]["ports"]] == [29501, 29500]


def test_host_port_base_moves_every_host_port_and_needs_host_network() -> None:
    job = _job("gpt-rdma", **{"spec.podTemplate.hostPortBase": 41000})
    for rank in range(job.world_size):
        trainer, fill = _containers(rank_pod(job, rank))
        ports = sorted(p["hostPort"] for c in (trainer, fill) for p in c["ports"])
        assert ports == sorted([41001 + 2 * rank, 41002 + 2 * rank, *([41000] if rank == 0 else [])])
        assert _env(trainer)["MASTER_PORT"] == "41000"
    with pytest.raises(ValueError, match=r"hostPortBase applies to host-network pods only .* set hostNetwork: true"):
        _job("gpt-rdma", **{"spec.podTemplate.hostPortBase": 41000, "spec.podTemplate.hostNetwork": False})
    with pytest.raises(ValueError, match="hostPortBase"):
        _job("gpt-rdma", **{"spec.podTemplate.hostPortBase": 64511})  # its 1025 ports would pass 65535


def test_gang_mechanisms_mark_the_pods() -> None:
    by_name = {j.name: j for j in JOBS}
    k8s = rank_pod(by_name["gpt-rdma"], 0)
    assert k8s["spec"]["schedulingGroup"] == {"podGroupName": "gpt-rdma"}
    assert "schedulerName" not in k8s["spec"]
    volcano = rank_pod(by_name["gang-volcano"], 0)
    assert volcano["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "gang-volcano"
    assert volcano["spec"]["schedulerName"] == "volcano"
    cosched = rank_pod(by_name["gang-coscheduling"], 0)
    assert cosched["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "gang-coscheduling"
    assert cosched["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    queued = rank_pod(by_name["queued"], 1, generation=4)
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "queued-g4"
    assert queued["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"


def test_fill_disabled_means_no_sidecar_and_rank_out_of_range_is_refused() -> None:
    job = _job("cpu-demo", **{"spec.fill.enabled": False})
    assert [c.name for c in rank_containers(job, 1)] == ["trainer"]
    pod = rank_pod(job, 1)
    assert "initContainers" not in pod["spec"]
    assert not {v["name"] for v in pod["spec"]["volumes"]} & {"api-token", "fill-shm"}
    with pytest.raises(ValueError, match=r"rank 2 is outside 0\.\.1"):
        rank_containers(job, 2)


def test_fill_storage_is_mounted_in_the_fill_sidecar_alone_and_named_in_its_environment() -> None:
    job = _job("cpu-demo", **{"spec.fill.storage": {"claimName": "fill-data", "mountPath": "/data/fill"}})
    pod = rank_pod(job, 0, namespace="team-a")
    trainer, fill = _containers(pod)
    assert {"name": "fill-storage", "persistentVolumeClaim": {"claimName": "fill-data"}} in pod["spec"]["volumes"]
    assert {"name": "fill-storage", "mountPath": "/data/fill"} in fill["volumeMounts"]
    assert all(m["name"] != "fill-storage" for m in trainer["volumeMounts"])
    assert _env(fill)[env.FILL_STORAGE_DIR] == "/data/fill"
    assert env.FILL_STORAGE_DIR not in _env(trainer)
    # the executor's identity in assignments comes from the downward API
    (uid,) = [e for e in fill["env"] if e["name"] == env.POD_UID]
    assert uid["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    # without storage: no claim, no variable; the default mount path
    plain = rank_pod(_job("cpu-demo"), 0)
    assert all(v["name"] != "fill-storage" for v in plain["spec"]["volumes"])
    assert env.FILL_STORAGE_DIR not in _env(_containers(plain)[1])
    default = _job("cpu-demo", **{"spec.fill.storage": {"claimName": "fill-data"}})
    assert _env(_containers(rank_pod(default, 0))[1])[env.FILL_STORAGE_DIR] == "/fill-storage"


def test_the_builders_max_active_jobs_reaches_the_fill_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    """One setting for the queue and the executor: the limit the operator passes goes into the fill sidecar only;
    the pod description reads no environment of its builder's."""
    monkeypatch.setenv(env.FILL_MAX_ACTIVE_JOBS, "5")  # ignored: the caller says
    assert env.FILL_MAX_ACTIVE_JOBS not in _env(_containers(rank_pod(_job("cpu-demo"), 0))[1])
    trainer, fill = _containers(rank_pod(_job("cpu-demo"), 0, max_active_jobs=3))
    assert _env(fill)[env.FILL_MAX_ACTIVE_JOBS] == "3" and env.FILL_MAX_ACTIVE_JOBS not in _env(trainer)


@pytest.mark.parametrize(
    ("source", "volume"),
    [
        ({"claimName": "models"}, {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}),
        ({"configMap": "llama-config"}, {"configMap": {"name": "llama-config"}}),
    ],
)
def test_a_hugging_face_models_directory_is_mounted_read_only_into_the_trainer_alone(
    source: dict[str, str], volume: dict[str, Any]
) -> None:
    model = {"huggingFace": {"path": "models/llama", **source}, "seqLen": 16}
    pod = rank_pod(_job("cpu-demo", **{"spec.model": model}), 0)
    trainer, fill = _containers(pod)
    assert {"name": "model", **volume} in pod["spec"]["volumes"]
    assert {"name": "model", "mountPath": "/workspace/models/llama", "readOnly": True} in trainer["volumeMounts"]
    assert all(m["name"] != "model" for m in fill["volumeMounts"])
    kubernetes_validate.validate(pod, K8S, strict=True)
    # a path the image holds (a trainer image built FROM ours): nothing to mount
    baked = rank_pod(_job("cpu-demo", **{"spec.model": {"huggingFace": {"path": "/opt/model"}}}), 0)
    assert all(v["name"] != "model" for v in baked["spec"]["volumes"])


def test_the_model_code_is_mounted_read_only_into_the_trainer_and_named_in_its_environment() -> None:
    from pipefill.pods import MODEL_CODE_MOUNT

    model = {"python": {"function": "mymodel:build", "code": {"configMap": "my-model"}}, "seqLen": 16}
    pod = rank_pod(_job("cpu-demo", **{"spec.model": model}), 0)
    trainer, fill = _containers(pod)
    assert {"name": "model-code", "configMap": {"name": "my-model"}} in pod["spec"]["volumes"]
    assert {"name": "model-code", "mountPath": MODEL_CODE_MOUNT, "readOnly": True} in trainer["volumeMounts"]
    assert _env(trainer)[env.MODEL_CODE_DIR] == MODEL_CODE_MOUNT
    assert all(m["name"] != "model-code" for m in fill["volumeMounts"]) and env.MODEL_CODE_DIR not in _env(fill)
    kubernetes_validate.validate(pod, K8S, strict=True)
    # code on the fill storage: the storage, read-only, in the trainer as well
    model = {"python": {"function": "mymodel:build", "code": {"path": "models/v1"}}, "seqLen": 16}
    storage = {"claimName": "fill-data", "mountPath": "/data/fill"}
    pod = rank_pod(_job("cpu-demo", **{"spec.model": model, "spec.fill.storage": storage}), 0)
    trainer, fill = _containers(pod)
    assert {"name": "fill-storage", "mountPath": "/data/fill", "readOnly": True} in trainer["volumeMounts"]
    assert {"name": "fill-storage", "mountPath": "/data/fill"} in fill["volumeMounts"]
    assert _env(trainer)[env.MODEL_CODE_DIR] == "/data/fill/models/v1"
    kubernetes_validate.validate(pod, K8S, strict=True)
