"""One description of a rank's pod, used by both the operator (as a Pod manifest) and ``pipefill local`` (as processes).

Every rank of a ``PipelineTrainingJob`` runs one pod: the trainer container and, when filling is on, the fill
executor as a native sidecar (an init container with ``restartPolicy: Always``: it starts first, is restarted when
it crashes, and does not keep the pod alive after training ends). Both mount a memory-backed ``emptyDir``, the bubble
channel. Commands, arguments and environment come from :func:`rank_containers` alone, so a local run and a cluster
run cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipefill import env
from pipefill.spec import PipelineTrainingJob, SharingMode, parse_bytes

__all__ = [
    "CHANNEL_MOUNT",
    "MASTER_PORT",
    "SPEC_MOUNT",
    "ContainerPlan",
    "pod_name",
    "rank_containers",
    "rank_pod",
    "service_name",
]

CHANNEL_MOUNT = env.DEFAULT_CHANNEL_DIR
SPEC_MOUNT = "/etc/pipefill"
SPEC_KEY = "job.yaml"
MASTER_PORT = 29500
TRAINER_METRICS_PORT = 9400
FILL_METRICS_PORT = 9401
WORKDIR = "/workspace"
_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class ContainerPlan:
    """What one container runs: the same for a Pod and for a local process."""

    name: str  # "trainer" or "fill-executor"
    image: str
    module: str  # run as ``python -m <module>``
    env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = 0

    @property
    def argv(self) -> list[str]:
        return ["python", "-m", self.module]


def pod_name(job: PipelineTrainingJob, rank: int) -> str:
    """``<job>-<rank>``; rank is global (replica × stages + stage)."""
    return f"{job.name}-{rank}"


def service_name(job: PipelineTrainingJob) -> str:
    """The headless Service giving each pod a DNS name (``<pod>.<service>``)."""
    return job.name


def _check_rank(job: PipelineTrainingJob, rank: int) -> None:
    if not 0 <= rank < job.world_size:
        raise ValueError(f"rank {rank} is outside 0..{job.world_size - 1} (stages × dataParallel of {job.name!r})")


def rank_containers(job: PipelineTrainingJob, rank: int) -> list[ContainerPlan]:
    """The fill executor (when filling is on) and the trainer of ``rank``, in start order."""
    _check_rank(job, rank)
    spec = job.spec
    common = {env.JOB_NAME: job.name, env.CHANNEL_DIR: CHANNEL_MOUNT}
    trainer_env = {
        **common,
        "RANK": str(rank),
        "WORLD_SIZE": str(job.world_size),
        "MASTER_ADDR": f"{pod_name(job, 0)}.{service_name(job)}",
        "MASTER_PORT": str(MASTER_PORT),
        env.SPEC_FILE: f"{SPEC_MOUNT}/{SPEC_KEY}",
        env.METRICS_PORT: str(TRAINER_METRICS_PORT),
        env.DEVICE: "cuda" if spec.resources.gpus > 0 else "cpu",
    }
    plans = []
    if spec.fill.enabled:
        fill_env = {
            **common,
            env.RANK: str(rank),
            env.WORK_SOURCE: "kubernetes",
            env.FILL_RESERVED_BYTES: str(parse_bytes(spec.fill.reserved_memory, field="spec.fill.reservedMemory")),
            env.FILL_MIN_BUBBLE_MS: str(spec.fill.min_bubble_milliseconds),
            env.FILL_GUARD_MS: str(spec.fill.guard_milliseconds),
            env.METRICS_PORT: str(FILL_METRICS_PORT),
            env.DEVICE: "cpu" if spec.gpu_sharing.mode == SharingMode.NONE or spec.resources.gpus == 0 else "cuda",
        }
        if spec.gpu_sharing.mode == SharingMode.VISIBLE_DEVICES:
            # The fill sees the node's GPUs and picks the trainer's by the UUID published on the channel.
            fill_env["NVIDIA_VISIBLE_DEVICES"] = "all"
        mps = spec.gpu_sharing.mps
        if mps.enabled:
            limit = mps.fill_pinned_memory_limit or spec.fill.reserved_memory
            fill_env["CUDA_MPS_CLIENT_PRIORITY"] = str(mps.fill_client_priority)
            fill_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps.fill_active_thread_percentage)
            mib = parse_bytes(limit, field="spec.gpuSharing.mps.fillPinnedMemoryLimit") // 2**20
            fill_env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mib}M"
        plans.append(ContainerPlan("fill-executor", spec.fill_image, "pipefill_fill", fill_env, FILL_METRICS_PORT))
    plans.append(ContainerPlan("trainer", spec.trainer_image, "pipefill_trainer", trainer_env, TRAINER_METRICS_PORT))
    return plans


def _absolute(path: str) -> str:
    """Relative paths in a spec are relative to the working directory: /workspace in a pod, the cwd locally."""
    return path if path.startswith("/") else f"{WORKDIR}/{path}"


def _volumes(job: PipelineTrainingJob) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Pod volumes, and the mount of each by volume name."""
    spec = job.spec
    volumes: list[dict[str, Any]] = [
        {"name": "channel", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "spec", "configMap": {"name": f"{job.name}-spec"}},
    ]
    mounts: dict[str, dict[str, Any]] = {
        "channel": {"name": "channel", "mountPath": CHANNEL_MOUNT},
        "dshm": {"name": "dshm", "mountPath": "/dev/shm"},
        "spec": {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
        "checkpoints": {"name": "checkpoints", "mountPath": _absolute(spec.checkpoint.path)},
    }
    if spec.checkpoint.claim_name:
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.checkpoint.claim_name}})
    else:
        volumes.append({"name": "checkpoints", "emptyDir": {}})
    if spec.data.claim_name and spec.data.path:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": spec.data.claim_name, "readOnly": True}})
        mounts["data"] = {
            "name": "data",
            "mountPath": _absolute(spec.data.path).rsplit("/", 1)[0] or "/",
            "readOnly": True,
        }
    # Only the fill executor talks to the API server, so only it gets a token.
    volumes.append(
        {
            "name": "api-token",
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {
                        "downwardAPI": {
                            "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                        }
                    },
                ]
            },
        }
    )
    mounts["api-token"] = {"name": "api-token", "mountPath": _TOKEN_DIR, "readOnly": True}
    return volumes, mounts


def _container(plan: ContainerPlan, mounts: list[dict[str, Any]], resources: dict[str, Any]) -> dict[str, Any]:
    env_list: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(plan.env.items())]
    env_list.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    env_list.append({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
    return {
        "name": plan.name,
        "image": plan.image,
        "command": plan.argv,
        "workingDir": WORKDIR,
        "env": env_list,
        "ports": [{"name": "metrics", "containerPort": plan.metrics_port, "protocol": "TCP"}],
        "volumeMounts": mounts,
        "resources": resources,
    }


def rank_pod(job: PipelineTrainingJob, rank: int, *, namespace: str = "default") -> dict[str, Any]:
    """The Pod manifest of ``rank``; valid against the Kubernetes Pod schema."""
    spec = job.spec
    plans = {p.name: p for p in rank_containers(job, rank)}
    volumes, mounts = _volumes(job)
    stage, replica = rank % spec.pipeline.stages, rank // spec.pipeline.stages
    labels = {
        "app.kubernetes.io/name": "pipefill",
        "app.kubernetes.io/managed-by": "pipefill-operator",
        "pipefill.io/job-name": job.name,
        "pipefill.io/rank": str(rank),
        "pipefill.io/stage": str(stage),
        "pipefill.io/replica": str(replica),
    }
    if spec.scheduling.queue_name:
        labels["kueue.x-k8s.io/queue-name"] = spec.scheduling.queue_name
    shared = [mounts["channel"]]
    trainer_mounts = [*shared, mounts["dshm"], mounts["spec"], mounts["checkpoints"]]
    if "data" in mounts:
        trainer_mounts.append(mounts["data"])
    trainer_res: dict[str, Any] = {"requests": {"cpu": str(spec.resources.cpu), "memory": str(spec.resources.memory)}}
    fill_res: dict[str, Any] = {}
    pod_spec: dict[str, Any] = {
        "hostname": pod_name(job, rank),
        "subdomain": service_name(job),
        "restartPolicy": "Never",  # the operator restarts the whole job from its checkpoint
        "automountServiceAccountToken": False,
        "volumes": volumes,
    }
    if spec.resources.gpus > 0 and spec.gpu_sharing.mode == SharingMode.DRA:
        pod_spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": f"{job.name}-gpu"}]
        trainer_res["claims"] = [{"name": "gpu"}]
        fill_res["claims"] = [{"name": "gpu"}]
    elif spec.resources.gpus > 0:
        count = str(spec.resources.gpus)
        trainer_res["limits"] = {spec.resources.gpu_resource_name: count}
    pod_spec["containers"] = [_container(plans["trainer"], trainer_mounts, trainer_res)]
    if "fill-executor" in plans:
        sidecar = _container(plans["fill-executor"], [*shared, mounts["dshm"], mounts["api-token"]], fill_res)
        sidecar["restartPolicy"] = "Always"  # native sidecar
        pod_spec["initContainers"] = [sidecar]
    if spec.scheduling.scheduler_name:
        pod_spec["schedulerName"] = spec.scheduling.scheduler_name
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name(job, rank), "namespace": namespace, "labels": labels},
        "spec": pod_spec,
    }
