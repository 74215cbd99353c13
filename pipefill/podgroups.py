"""Gang scheduling and queueing: the PodGroup of each mechanism and what every rank pod carries to join it.

One model per mechanism (``spec.scheduling.gang``; docs/operator.md#gang-scheduling), one PodGroup per job, named
like the job and reused by every generation (a generation's pods replace the last one's only after those are gone):

- ``kubernetes``: Kubernetes' own gang scheduling (KEP-4671; alpha in 1.35, ``scheduling.k8s.io/v1alpha2`` in 1.36,
  feature gates ``GenericWorkload`` and ``GangScheduling``): a standalone PodGroup with ``schedulingPolicy.gang`` and
  ``spec.schedulingGroup.podGroupName`` on each pod. The default scheduler holds the pods until ``minCount`` of them
  can be placed at once.
- ``volcano``: PodGroup ``scheduling.volcano.sh/v1beta1`` and the pod annotation ``scheduling.k8s.io/group-name``.
- ``coscheduling``: PodGroup ``scheduling.x-k8s.io/v1alpha1`` of scheduler-plugins and the pod label
  ``scheduling.x-k8s.io/pod-group``.
- ``spec.scheduling.queueName``: Kueue's plain-pod groups (labels ``kueue.x-k8s.io/queue-name`` and
  ``kueue.x-k8s.io/pod-group-name``, annotation ``kueue.x-k8s.io/pod-group-total-count``). Kueue admits a group
  once, so each generation is its own group ``<job>-g<generation>``.
"""

from __future__ import annotations

from typing import Any

from pipefill.spec import GangMode, PipelineTrainingJob

__all__ = [
    "KUEUE_GROUP_LABEL",
    "KUEUE_QUEUE_LABEL",
    "KUEUE_TOTAL_ANNOTATION",
    "POD_GROUP_APIS",
    "gang_pod_fields",
    "min_members",
    "pod_group",
    "pod_group_name",
]

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"

# gang mode -> apiVersion of its PodGroup
POD_GROUP_APIS: dict[GangMode, str] = {
    GangMode.KUBERNETES: "scheduling.k8s.io/v1alpha2",
    GangMode.VOLCANO: "scheduling.volcano.sh/v1beta1",
    GangMode.COSCHEDULING: "scheduling.x-k8s.io/v1alpha1",
}
# How long coscheduling keeps a partial gang's pods waiting before it gives the place back (its own default is 60 s,
# too short for a large gang on a busy cluster).
_COSCHEDULING_TIMEOUT_S = 600


def pod_group_name(job: PipelineTrainingJob) -> str:
    return job.name


def min_members(job: PipelineTrainingJob) -> int:
    """Pods that must be placed together: all ranks unless ``gangMinMembers`` says fewer."""
    return job.spec.scheduling.gang_min_members or job.world_size


def pod_group(job: PipelineTrainingJob, *, namespace: str, metadata: dict[str, Any]) -> dict[str, Any] | None:
    """The PodGroup of ``spec.scheduling.gang``, or None without one; ``metadata`` adds labels and ownerReferences."""
    mode = job.spec.scheduling.gang
    if mode == GangMode.NONE:
        return None
    count = min_members(job)
    spec: dict[str, Any]
    if mode == GangMode.KUBERNETES:
        spec = {"schedulingPolicy": {"gang": {"minCount": count}}}
    elif mode == GangMode.VOLCANO:
        spec = {"minMember": count}
        if job.spec.scheduling.priority_class_name:
            spec["priorityClassName"] = job.spec.scheduling.priority_class_name
    else:
        spec = {"minMember": count, "scheduleTimeoutSeconds": _COSCHEDULING_TIMEOUT_S}
    return {
        "apiVersion": POD_GROUP_APIS[mode],
        "kind": "PodGroup",
        "metadata": {**metadata, "name": pod_group_name(job), "namespace": namespace},
        "spec": spec,
    }


def gang_pod_fields(
    job: PipelineTrainingJob, generation: int, metadata: dict[str, Any], pod_spec: dict[str, Any]
) -> None:
    """Add to a rank pod's ``metadata`` and ``spec`` what makes it a member of the gang and of the Kueue group."""
    scheduling = job.spec.scheduling
    labels = metadata.setdefault("labels", {})
    annotations = metadata.setdefault("annotations", {})
    if scheduling.gang == GangMode.KUBERNETES:
        pod_spec["schedulingGroup"] = {"podGroupName": pod_group_name(job)}
    elif scheduling.gang == GangMode.VOLCANO:
        annotations[VOLCANO_GROUP_ANNOTATION] = pod_group_name(job)
    elif scheduling.gang == GangMode.COSCHEDULING:
        labels[COSCHEDULING_GROUP_LABEL] = pod_group_name(job)
    if scheduling.queue_name:
        labels[KUEUE_QUEUE_LABEL] = scheduling.queue_name
        labels[KUEUE_GROUP_LABEL] = f"{job.name}-g{generation}"
        annotations[KUEUE_TOTAL_ANNOTATION] = str(job.world_size)
    if not annotations:
        del metadata["annotations"]
