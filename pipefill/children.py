"""What a cluster needs around the rank pods of a ``PipelineTrainingJob``, built in the core so both runners share it.

The operator creates these objects, all owned by the job (garbage collection removes them with it), all named after
the job so a create is idempotent: the headless Service (rank discovery, ``<pod>.<job>``), the spec ConfigMap only
where a pod's annotation cannot carry the spec (:func:`spec_in_config_map`), the ResourceClaimTemplate of
``gpuSharing: dra``, the fill executor's ServiceAccount, Role and RoleBinding, the optional PodDisruptionBudget and the
PodGroup of the gang mechanism. ``pipefill local`` writes the same spec document (:func:`spec_document`) and takes the
custom schedule from the same ConfigMap manifest.

The trainer reads its job from a file (``PIPEFILL_SPEC_FILE``, ``/etc/pipefill/job.yaml``). Usually that file is the
rank pod's own annotation :data:`SPEC_ANNOTATION`, shown by a downward API volume: it travels in the pod's create,
so a job costs no request for it (a ConfigMap was one create per job, and one more watch per job for every kubelet
that mounts it). The ConfigMap stays for two cases: ``schedule: custom``, whose CSV (one row per rank, one entry per
action) has no bound and is copied from the user's ConfigMap, and a spec too large for the annotation budget
(:data:`SPEC_ANNOTATION_BUDGET_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from pipefill.podgroups import pod_group
from pipefill.spec import API_VERSION, PipelineTrainingJob, Schedule, SharingMode, to_obj

__all__ = [
    "FILL_ACCOUNT",
    "FILL_RULES",
    "JOB_LABEL",
    "SPEC_ANNOTATION",
    "SPEC_ANNOTATION_BUDGET_BYTES",
    "SPEC_KEY",
    "Owner",
    "child_labels",
    "claim_template",
    "claim_template_name",
    "desired_children",
    "disruption_budget",
    "fill_account_name",
    "fill_rbac",
    "headless_service",
    "owner_references",
    "schedule_csv_of",
    "service_name",
    "spec_config_map",
    "spec_config_name",
    "spec_document",
    "spec_in_config_map",
]

JOB_LABEL = "pipefill.io/job-name"
SPEC_KEY = "job.yaml"
SPEC_ANNOTATION = "pipefill.io/spec"
"""The rank pod's annotation holding :func:`spec_document`, unless :func:`spec_in_config_map`."""
SPEC_ANNOTATION_BUDGET_BYTES = 128 * 1024
"""Bytes the spec annotation and the pod template's annotations may take together (keys and values, as the API server
counts them); more, and the spec goes in the ConfigMap. Half of Kubernetes' 256 KiB limit on all of an object's
annotations, so admission webhooks and other controllers that annotate pods keep room. The examples' documents take
2-3 KiB."""
RENDEZVOUS_PORT = 29500
# Exactly what the fill executor's Kubernetes work source calls (pipefill_fill.sources.kubernetes): it lists the
# FillJobs of its namespace, reads and patches their status; and what its workload loader calls
# (pipefill_fill.configmaps): it reads the ConfigMap of a FillJob's spec.workload.code.configMap at job start.
# The operator must hold these verbs itself to grant them.
FILL_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["pipefill.io"], "resources": ["filljobs"], "verbs": ["list", "watch"]},
    {"apiGroups": ["pipefill.io"], "resources": ["filljobs/status"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
]


@dataclass(frozen=True)
class Owner:
    """The PipelineTrainingJob that owns the children: its name and the uid the API server gave it."""

    name: str
    uid: str


def owner_references(owner: Owner) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "PipelineTrainingJob",
            "name": owner.name,
            "uid": owner.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def child_labels(job: PipelineTrainingJob) -> dict[str, str]:
    """Labels on every child; ``pipefill.io/job-name`` selects a job's pods."""
    return {
        "app.kubernetes.io/name": "pipefill",
        "app.kubernetes.io/managed-by": "pipefill-operator",
        JOB_LABEL: job.name,
    }


def service_name(job: PipelineTrainingJob) -> str:
    """The headless Service giving each pod a DNS name (``<pod>.<service>``)."""
    return job.name


def spec_config_name(job: PipelineTrainingJob) -> str:
    return f"{job.name}-spec"


def claim_template_name(job: PipelineTrainingJob) -> str:
    """The ResourceClaimTemplate of ``gpuSharing: dra``: one claim per pod, shared by both containers."""
    return f"{job.name}-gpu"


FILL_ACCOUNT = "pipefill-fill"
"""ServiceAccount, Role and RoleBinding of the fill executors of a namespace (the rank pods' serviceAccountName).

One identity per namespace, not per job: the Role grants FillJobs of the namespace, the same for every job there, and
three objects fewer per job are three requests fewer when a thousand jobs start at once. Owned by no job, so deleting
the last job leaves them (like a namespace's default ServiceAccount)."""


def fill_account_name(job: PipelineTrainingJob) -> str:
    """The rank pods' serviceAccountName: the namespace's fill identity (:data:`FILL_ACCOUNT`)."""
    del job
    return FILL_ACCOUNT


def _meta(job: PipelineTrainingJob, name: str, namespace: str, owner: Owner | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": child_labels(job)}
    if owner is not None:
        meta["ownerReferences"] = owner_references(owner)
    return meta


def headless_service(job: PipelineTrainingJob, *, namespace: str, owner: Owner | None = None) -> dict[str, Any]:
    """Rank discovery: DNS answers for ``<job>-<rank>.<job>`` before the pods are ready (the rendezvous needs it)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, service_name(job), namespace, owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: job.name},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}],
        },
    }


def spec_document(job: PipelineTrainingJob) -> str:
    """The manifest the trainer reads (``PIPEFILL_SPEC_FILE``): the validated, defaulted job, without server fields."""
    obj = to_obj(job)
    meta = job.metadata
    obj["metadata"] = {k: meta[k] for k in ("name", "namespace", "labels") if meta.get(k)}
    obj.pop("status", None)
    # libyaml's emitter where PyYAML has it (its wheels do): the pure-Python one took 20 ms a job, a quarter of the
    # operator's own CPU while it created a thousand jobs
    return yaml.dump(obj, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


def spec_in_config_map(job: PipelineTrainingJob, document: str | None = None) -> bool:
    """Whether the rank pods read the spec from the spec ConfigMap rather than from their annotation.

    True for ``schedule: custom`` (the CSV beside the spec comes from the user's ConfigMap and has no size bound) and
    for a spec whose annotation would exceed :data:`SPEC_ANNOTATION_BUDGET_BYTES`. ``document`` is
    :func:`spec_document` of ``job`` where the caller has it (it takes longer to write than the pod).
    """
    if job.spec.pipeline.schedule == Schedule.CUSTOM:
        return True
    text = spec_document(job) if document is None else document
    user = sum(len(k.encode()) + len(v.encode()) for k, v in job.spec.pod_template.annotations.items())
    return len(SPEC_ANNOTATION) + len(text.encode()) + user > SPEC_ANNOTATION_BUDGET_BYTES


def schedule_csv_of(job: PipelineTrainingJob, config_map: dict[str, Any] | None) -> str | None:
    """The custom schedule's CSV from the user's ConfigMap (named by ``spec.pipeline.customSchedule``).

    None when the job needs none. Raises ``LookupError`` naming the ConfigMap and key when it is missing (the
    operator waits for it; ``pipefill local`` asks for it on the command line).
    """
    ref = job.spec.pipeline.custom_schedule
    if job.spec.pipeline.schedule != Schedule.CUSTOM or ref is None:
        return None
    if config_map is None:
        raise LookupError(f"ConfigMap {ref.name!r} (spec.pipeline.customSchedule.name) does not exist")
    data = config_map.get("data") or {}
    if ref.key not in data:
        keys = ", ".join(sorted(data)) or "none"
        raise LookupError(
            f"ConfigMap {ref.name!r} has no key {ref.key!r} (spec.pipeline.customSchedule.key); its keys: {keys}"
        )
    return str(data[ref.key])


def spec_config_map(
    job: PipelineTrainingJob, *, namespace: str, owner: Owner | None = None, schedule_csv: str | None = None
) -> dict[str, Any]:
    """The spec ConfigMap mounted at /etc/pipefill where :func:`spec_in_config_map`: ``job.yaml`` and, for
    ``schedule: custom``, the CSV."""
    data = {SPEC_KEY: spec_document(job)}
    ref = job.spec.pipeline.custom_schedule
    if schedule_csv is not None and ref is not None:
        if ref.key == SPEC_KEY:
            raise ValueError(
                f"spec.pipeline.customSchedule.key: Invalid value: {ref.key!r}: the spec ConfigMap holds the job "
                f"as {SPEC_KEY}; use another key such as schedule.csv"
            )
        data[ref.key] = schedule_csv
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, spec_config_name(job), namespace, owner),
        "data": data,
    }


def claim_template(job: PipelineTrainingJob, *, namespace: str, owner: Owner | None = None) -> dict[str, Any] | None:
    """The ResourceClaimTemplate of ``gpuSharing: dra`` (``resource.k8s.io/v1``, GA in Kubernetes 1.34)."""
    spec = job.spec
    if spec.gpu_sharing.mode != SharingMode.DRA or spec.resources.gpus == 0:
        return None
    request: dict[str, Any] = {
        "name": "gpu",
        "exactly": {"deviceClassName": spec.gpu_sharing.device_class_name, "count": spec.resources.gpus},
    }
    claim: dict[str, Any] = {"devices": {"requests": [request]}}
    if spec.gpu_sharing.mps.enabled:
        # The NVIDIA DRA driver starts an MPS control daemon for the claim. No limits here: they would apply to the
        # trainer too; the fill's own cap is its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
        claim["devices"]["config"] = [
            {
                "requests": ["gpu"],
                "opaque": {
                    "driver": spec.gpu_sharing.device_class_name,
                    "parameters": {
                        "apiVersion": "resource.nvidia.com/v1beta1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "MPS"},
                    },
                },
            }
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _meta(job, claim_template_name(job), namespace, owner),
        "spec": {"spec": claim},
    }


def fill_rbac(*, namespace: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding of the fill executors of ``namespace``: FillJobs of this namespace and
    nothing else. In creation order (RBAC checks a RoleBinding against its Role, so the Role comes first)."""
    name = FILL_ACCOUNT
    meta = {
        "name": name,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/name": "pipefill", "app.kubernetes.io/managed-by": "pipefill-operator"},
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta,
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": FILL_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


def disruption_budget(job: PipelineTrainingJob, *, namespace: str, owner: Owner | None = None) -> dict[str, Any] | None:
    """With ``spec.scheduling.podDisruptionBudget``: no voluntary eviction of a healthy running gang."""
    if not job.spec.scheduling.pod_disruption_budget:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(job, job.name, namespace, owner),
        "spec": {
            "minAvailable": job.world_size,
            "selector": {"matchLabels": {JOB_LABEL: job.name}},
            # A gang that is not running anyway must not block a node drain.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def desired_children(
    job: PipelineTrainingJob,
    *,
    namespace: str,
    owner: Owner | None = None,
    schedule_csv: str | None = None,
    document: str | None = None,
) -> list[dict[str, Any]]:
    """Every child of the job but the pods, in creation order (what the pods reference comes first). The pods' fill
    identity is the namespace's (:func:`fill_rbac`), not the job's; the spec ConfigMap is one only where
    :func:`spec_in_config_map` (``document``: the job's :func:`spec_document`, where the caller has it)."""
    group = pod_group(job, namespace=namespace, metadata=_meta(job, job.name, namespace, owner))
    spec_map = None
    if spec_in_config_map(job, document):
        spec_map = spec_config_map(job, namespace=namespace, owner=owner, schedule_csv=schedule_csv)
    optional = [
        spec_map,
        claim_template(job, namespace=namespace, owner=owner),
        disruption_budget(job, namespace=namespace, owner=owner),
        group,
    ]
    return [
        headless_service(job, namespace=namespace, owner=owner),
        *[obj for obj in optional if obj is not None],
    ]
