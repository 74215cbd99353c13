"""One description of a rank's pod, used by both the operator (as a Pod manifest) and ``pipefill local`` (as processes).

Every rank of a ``PipelineTrainingJob`` runs one pod: the trainer and, when filling is on, the fill executor as a
native sidecar (an init container with ``restartPolicy: Always``: it starts first, restarts when it crashes, and does
not keep the pod alive after training ends), both on a memory-backed ``emptyDir``, the bubble channel. Commands,
arguments and environment come from :func:`rank_containers` alone, so local and cluster runs cannot drift apart;
what only a pod needs (security context, writable scratch on a read-only root, the fill's API token, the spec as a
file, the user's ``spec.podTemplate``) is added by :func:`rank_pod`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipefill import env
from pipefill.children import (
    SPEC_ANNOTATION,
    SPEC_KEY,
    Owner,
    child_labels,
    claim_template_name,
    fill_account_name,
    owner_references,
    service_name,
    spec_config_name,
    spec_document,
    spec_in_config_map,
)
from pipefill.overlay import apply_overlay
from pipefill.podgroups import gang_pod_fields
from pipefill.rankports import MASTER_PORT, rank_ports
from pipefill.spec import PipelineTrainingJob, Schedule, SharingMode, parse_bytes
from pipefill.usercommand import add_hook, trainer_command

__all__ = [
    "CHANNEL_MOUNT",
    "GENERATION_LABEL",
    "MASTER_PORT",
    "MODEL_CODE_MOUNT",
    "RANK_LABEL",
    "SPEC_GENERATION_LABEL",
    "SPEC_MOUNT",
    "ContainerPlan",
    "claim_template_name",
    "pod_name",
    "rank_containers",
    "rank_pod",
    "service_name",
]

CHANNEL_MOUNT = env.DEFAULT_CHANNEL_DIR
SPEC_MOUNT = "/etc/pipefill"
MODEL_CODE_MOUNT = "/etc/pipefill-model-code"  # spec.model.python.code.configMap, in the trainer
WORKDIR = "/workspace"
SCRATCH_DIR = f"{WORKDIR}/runs"  # where relative outputs land (runs/…): writable, the image's /workspace stays visible
HOME_DIR = "/home/pipefill"
# Each container's own writable /tmp, HOME and caches (torch writes there on import), read-only root: docs/operations.md
_OWN_DIRS = {"tmp": "/tmp", "home": HOME_DIR, "cache": "/var/cache/pipefill"}
RANK_LABEL = "pipefill.io/rank"
GENERATION_LABEL = "pipefill.io/generation"
SPEC_GENERATION_LABEL = "pipefill.io/spec-generation"
"""the job's ``metadata.generation`` a pod was built from: a spec changed since shows as SpecChangePending"""
_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class ContainerPlan:
    """What one container runs: the same for a Pod and for a local process."""

    name: str  # "trainer" or "fill-executor"
    image: str
    module: str  # run as ``python -m <module>``
    env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = 0
    command: tuple[str, ...] = ()  # spec.trainer's command and args instead of ``python -m <module>``

    @property
    def argv(self) -> list[str]:
        return list(self.command) if self.command else ["python", "-m", self.module]


def pod_name(job: PipelineTrainingJob, rank: int) -> str:
    """``<job>-<rank>``; rank is global (replica × stages + stage). Every generation reuses the names."""
    return f"{job.name}-{rank}"


def _check_rank(job: PipelineTrainingJob, rank: int) -> None:
    if not 0 <= rank < job.world_size:
        raise ValueError(f"rank {rank} is outside 0..{job.world_size - 1} (stages × dataParallel of {job.name!r})")


def rank_containers(job: PipelineTrainingJob, rank: int, *, max_active_jobs: int | None = None) -> list[ContainerPlan]:
    """The fill executor (when filling is on) and the trainer of ``rank``, in start order. ``max_active_jobs``: the
    fill jobs an executor runs at once (the operator's queue's limit, so the two agree; None: the executor's)."""
    _check_rank(job, rank)
    spec = job.spec
    ports = rank_ports(job, rank)  # under hostNetwork, each rank's own (pipefill.rankports)
    trainer_port, fill_port = ports.trainer_metrics, ports.fill_metrics
    common = {env.JOB_NAME: job.name, env.CHANNEL_DIR: CHANNEL_MOUNT}
    trainer_env = {
        **common,
        "RANK": str(rank),
        "WORLD_SIZE": str(job.world_size),
        "MASTER_ADDR": f"{pod_name(job, 0)}.{service_name(job)}",
        "MASTER_PORT": str(ports.rendezvous),
        env.SPEC_FILE: f"{SPEC_MOUNT}/{SPEC_KEY}",
        env.METRICS_PORT: str(trainer_port),
        env.DEVICE: "cuda" if spec.resources.gpus > 0 else "cpu",
    }
    code = spec.model.python.code if spec.model.python is not None else None
    if code is not None and code.config_map:
        trainer_env[env.MODEL_CODE_DIR] = MODEL_CODE_MOUNT
    elif code is not None and code.path and spec.fill.storage is not None:
        trainer_env[env.MODEL_CODE_DIR] = f"{spec.fill.storage.mount_path.rstrip('/')}/{code.path}"
    plans = []
    if spec.fill.enabled:
        fill_env = {
            **common,
            env.RANK: str(rank),
            env.WORK_SOURCE: "kubernetes",
            env.FILL_RESERVED_BYTES: str(parse_bytes(spec.fill.reserved_memory, field="spec.fill.reservedMemory")),
            env.FILL_GUARD_MS: str(spec.fill.guard_milliseconds),
            env.METRICS_PORT: str(fill_port),
            env.DEVICE: "cpu" if spec.gpu_sharing.mode == SharingMode.NONE or spec.resources.gpus == 0 else "cuda",
        }
        if spec.fill.min_bubble_milliseconds is not None:  # unset: the fill's own floor
            fill_env[env.FILL_MIN_BUBBLE_MS] = str(spec.fill.min_bubble_milliseconds)
        if spec.fill.storage is not None:
            fill_env[env.FILL_STORAGE_DIR] = spec.fill.storage.mount_path
        if max_active_jobs is not None:
            fill_env[env.FILL_MAX_ACTIVE_JOBS] = str(max_active_jobs)
        if spec.gpu_sharing.mode == SharingMode.VISIBLE_DEVICES:
            # The fill sees the node's GPUs and picks the trainer's by the UUID published on the channel.
            fill_env["NVIDIA_VISIBLE_DEVICES"] = "all"
        mps = spec.gpu_sharing.mps
        if mps.enabled:
            # Per container, never in the DRA claim: a claim's MPS limits would cap the trainer as well.
            limit = mps.fill_pinned_memory_limit or spec.fill.reserved_memory
            fill_env["CUDA_MPS_CLIENT_PRIORITY"] = str(mps.fill_client_priority)
            fill_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps.fill_active_thread_percentage)
            mib = parse_bytes(limit, field="spec.gpuSharing.mps.fillPinnedMemoryLimit") // 2**20
            fill_env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mib}M"
        plans.append(ContainerPlan("fill-executor", spec.fill_image, "pipefill_fill", fill_env, fill_port))
    image, argv = trainer_command(job, rank, trainer_env, master_port=ports.rendezvous)  # spec.trainer: the user's
    plans.append(ContainerPlan("trainer", image, "pipefill_trainer", trainer_env, trainer_port, argv))
    return plans


def _absolute(path: str) -> str:
    """Relative paths in a spec are relative to the working directory: /workspace in a pod, the cwd locally."""
    return path if path.startswith("/") else f"{WORKDIR}/{path}"


def _spec_volume(job: PipelineTrainingJob, in_config_map: bool) -> dict[str, Any]:
    """What the trainer finds at ``/etc/pipefill/job.yaml``: the pod's own spec annotation through the downward API
    (the kubelet writes the value as it is), or the spec ConfigMap (children.spec_in_config_map says which)."""
    if in_config_map:
        return {"name": "spec", "configMap": {"name": spec_config_name(job)}}
    field_path = f"metadata.annotations['{SPEC_ANNOTATION}']"
    return {"name": "spec", "downwardAPI": {"items": [{"path": SPEC_KEY, "fieldRef": {"fieldPath": field_path}}]}}


def _volumes(job: PipelineTrainingJob, spec_in_map: bool) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Pod volumes, and the mount of each by volume name."""
    spec = job.spec
    memory: dict[str, Any] = {"emptyDir": {"medium": "Memory"}}
    volumes: list[dict[str, Any]] = [
        {"name": "channel", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "dshm", **memory},
        {"name": "fill-shm", **memory},  # the fill's own /dev/shm: it never sees the trainer's
        _spec_volume(job, spec_in_map),
        {"name": "scratch", "emptyDir": {}},
    ]
    mounts: dict[str, dict[str, Any]] = {
        "channel": {"name": "channel", "mountPath": CHANNEL_MOUNT},
        "dshm": {"name": "dshm", "mountPath": "/dev/shm"},
        "fill-shm": {"name": "fill-shm", "mountPath": "/dev/shm"},
        "spec": {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
        "scratch": {"name": "scratch", "mountPath": SCRATCH_DIR},
        "checkpoints": {"name": "checkpoints", "mountPath": _absolute(spec.checkpoint.path)},
    }
    for container in ("trainer", "fill"):
        for what, path in _OWN_DIRS.items():
            volumes.append({"name": f"{container}-{what}", "emptyDir": {}})
            mounts[f"{container}-{what}"] = {"name": f"{container}-{what}", "mountPath": path}
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
    hf = spec.model.hugging_face
    if hf is not None and (hf.claim_name or hf.config_map):  # the model's directory: the trainer's alone, read-only
        source = (
            {"persistentVolumeClaim": {"claimName": hf.claim_name, "readOnly": True}}
            if hf.claim_name
            else {"configMap": {"name": hf.config_map}}
        )
        volumes.append({"name": "model", **source})
        mounts["model"] = {"name": "model", "mountPath": _absolute(hf.path), "readOnly": True}
    if spec.fill.storage is not None:  # FillJob inputs and outputs, shared by every rank (ReadWriteMany)
        volumes.append({"name": "fill-storage", "persistentVolumeClaim": {"claimName": spec.fill.storage.claim_name}})
        mounts["fill-storage"] = {"name": "fill-storage", "mountPath": spec.fill.storage.mount_path}
    code = spec.model.python.code if spec.model.python is not None else None
    if code is not None and code.config_map:  # the model's code, for the trainer alone
        volumes.append({"name": "model-code", "configMap": {"name": code.config_map}})
        mounts["model-code"] = {"name": "model-code", "mountPath": MODEL_CODE_MOUNT, "readOnly": True}
    elif code is not None and code.path and "fill-storage" in mounts:  # read-only: the trainer never writes there
        mounts["model-code"] = {**mounts["fill-storage"], "readOnly": True}
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


_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def _container(
    plan: ContainerPlan, mounts: list[dict[str, Any]], resources: dict[str, Any], ports: list[dict[str, Any]]
) -> dict[str, Any]:
    # What only a pod needs: a writable HOME and caches on the read-only root filesystem (locally the user's own).
    pod_env = {
        "HOME": HOME_DIR,
        "XDG_CACHE_HOME": f"{HOME_DIR}/.cache",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        **plan.env,
    }
    env_list: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(pod_env.items())]
    env_list.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    env_list.append({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
    return {
        "name": plan.name,
        "image": plan.image,
        "command": plan.argv,
        "workingDir": WORKDIR,
        "env": env_list,
        "ports": ports,
        "volumeMounts": mounts,
        "resources": resources,
        "securityContext": dict(_CONTAINER_SECURITY),
        # The kubelet keeps the end of the log as the termination message when the container wrote none, so the
        # operator can name why a rank failed without the logs API.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _port(name: str, number: int, host_network: bool) -> dict[str, Any]:
    port: dict[str, Any] = {"name": name, "containerPort": number, "protocol": "TCP"}
    if host_network:
        port["hostPort"] = number
    return port


def _scheduler_name(job: PipelineTrainingJob) -> str | None:
    scheduling = job.spec.scheduling
    if scheduling.scheduler_name:
        return scheduling.scheduler_name
    return {"volcano": "volcano", "coscheduling": "scheduler-plugins-scheduler"}.get(scheduling.gang.value)


def rank_pod(
    job: PipelineTrainingJob,
    rank: int,
    *,
    namespace: str = "default",
    generation: int = 0,
    owner: Owner | None = None,
    document: str | None = None,
    spec_generation: int | None = None,
    max_active_jobs: int | None = None,
) -> dict[str, Any]:
    """The Pod manifest of ``rank`` in gang ``generation``; valid against the Kubernetes Pod schema.
    ``spec_generation``: the job's ``metadata.generation`` whose spec it carries (labelled; the operator's pods);
    ``max_active_jobs``: see :func:`rank_containers`.

    ``document`` is the job's :func:`~pipefill.children.spec_document` where the caller has it: one writes it once
    for a whole gang (its YAML takes ~0.5 ms, ten times the rest of the pod). Raises ``ValueError`` naming the field
    when ``spec.podTemplate`` collides with what the operator sets.
    """
    spec = job.spec
    plans = {p.name: p for p in rank_containers(job, rank, max_active_jobs=max_active_jobs)}
    if document is None:
        document = spec_document(job)
    in_map = spec_in_config_map(job, document)
    volumes, mounts = _volumes(job, in_map)
    stage, replica = rank % spec.pipeline.stages, rank // spec.pipeline.stages
    host_network = spec.pod_template.host_network
    labels = {
        **child_labels(job),
        RANK_LABEL: str(rank),
        "pipefill.io/stage": str(stage),
        "pipefill.io/replica": str(replica),
        GENERATION_LABEL: str(generation),
        **({SPEC_GENERATION_LABEL: str(spec_generation)} if spec_generation is not None else {}),
    }
    trainer_mounts = [mounts[k] for k in ("channel", "dshm", "spec", "scratch", *(f"trainer-{d}" for d in _OWN_DIRS))]
    trainer_mounts.append(mounts["checkpoints"])
    trainer_mounts += [mounts[k] for k in ("data", "model", "model-code") if k in mounts]
    trainer_res: dict[str, Any] = {"requests": {"cpu": str(spec.resources.cpu), "memory": str(spec.resources.memory)}}
    fill_res: dict[str, Any] = {"requests": {"cpu": str(spec.fill.cpu), "memory": str(spec.fill.memory)}}
    security = spec.pod_template.security
    pod_spec: dict[str, Any] = {
        "hostname": pod_name(job, rank),
        "subdomain": service_name(job),
        "restartPolicy": "Never",  # the operator restarts the whole gang from its checkpoint
        "serviceAccountName": fill_account_name(job),
        "automountServiceAccountToken": False,  # the token is projected into the fill executor alone
        "terminationGracePeriodSeconds": spec.run_policy.termination_grace_period_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": security.run_as_user,
            "runAsGroup": security.run_as_group,
            "fsGroup": security.fs_group,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": volumes,
    }
    if spec.resources.gpus > 0 and spec.gpu_sharing.mode == SharingMode.DRA:
        pod_spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim_template_name(job)}]
        trainer_res["claims"] = [{"name": "gpu"}]
        fill_res["claims"] = [{"name": "gpu"}]
    elif spec.resources.gpus > 0:
        count = str(spec.resources.gpus)
        trainer_res["limits"] = {spec.resources.gpu_resource_name: count}
    trainer = plans["trainer"]
    trainer_ports = [_port("trainer-metrics", trainer.metrics_port, host_network)]
    if rank == 0:  # the rendezvous (MASTER_ADDR points at rank 0)
        trainer_ports.append(_port("rendezvous", rank_ports(job, rank).rendezvous, host_network))
    pod_spec["containers"] = [_container(trainer, trainer_mounts, trainer_res, trainer_ports)]
    if spec.pipeline.schedule == Schedule.CUSTOM and spec.pipeline.custom_schedule is not None:
        key = spec.pipeline.custom_schedule.key
        pod_spec["containers"][0]["env"].append({"name": env.SCHEDULE_FILE, "value": f"{SPEC_MOUNT}/{key}"})
    if "fill-executor" in plans:
        fill = plans["fill-executor"]
        fill_mounts = [mounts[k] for k in ("channel", "fill-shm", "scratch", *(f"fill-{d}" for d in _OWN_DIRS))]
        fill_mounts.append(mounts["api-token"])
        if "fill-storage" in mounts:
            fill_mounts.append(mounts["fill-storage"])
        fill_ports = [_port("fill-metrics", fill.metrics_port, host_network)]
        sidecar = _container(fill, fill_mounts, fill_res, fill_ports)
        # the executor's identity in FillJob assignments: a restarted gang reuses pod names, never uids
        sidecar["env"].append({"name": env.POD_UID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}})
        sidecar["restartPolicy"] = "Always"  # native sidecar
        pod_spec["initContainers"] = [sidecar]
    add_hook(job, pod_spec)  # spec.trainer.hook: the init container and volume that bring the hook in
    scheduler = _scheduler_name(job)
    if scheduler:
        pod_spec["schedulerName"] = scheduler
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    mounted = {
        m["name"] for c in [*pod_spec["containers"], *pod_spec.get("initContainers", [])] for m in c["volumeMounts"]
    }
    pod_spec["volumes"] = [v for v in volumes if v["name"] in mounted]
    metadata: dict[str, Any] = {"name": pod_name(job, rank), "namespace": namespace, "labels": labels}
    if not in_map:
        metadata["annotations"] = {SPEC_ANNOTATION: document}
    gang_pod_fields(job, generation, metadata, pod_spec)
    if owner is not None:
        metadata["ownerReferences"] = owner_references(owner)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
    apply_overlay(pod, spec.pod_template)
    return pod
