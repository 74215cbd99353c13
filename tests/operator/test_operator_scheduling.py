"""Gang scheduling and GPU sharing for real: Kubernetes 1.36's own gang scheduling (PodGroup
scheduling.k8s.io/v1alpha2, feature gates on in the test control plane) places a gang all or nothing, and a DRA job's
ResourceClaims are allocated by the scheduler from the kwok nodes' ResourceSlices. Volcano, coscheduling and Kueue
are rendered only (tests/spec): their CRDs and controllers are not on the test server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from operator_harness import Kube, OperatorProcess, job_manifest, phase, running

from pipefill.devcluster import ControlPlane

pytestmark = pytest.mark.cluster


def _unschedulable(count: int) -> Callable[[list[dict[str, Any]]], bool]:
    def check(pods: list[dict[str, Any]]) -> bool:
        return len(pods) == count and all(
            any(
                c["type"] == "PodScheduled" and c["status"] == "False"
                for c in (p.get("status") or {}).get("conditions", [])
            )
            for p in pods
        )

    return check


def test_kubernetes_gang_scheduling_places_a_gang_all_or_nothing(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    kube.create_job(namespace, job_manifest("fits", scheduling={"gang": "kubernetes"}))
    pods = kube.wait_pods(namespace, "fits", running(2))
    assert all(p["spec"]["schedulingGroup"] == {"podGroupName": "fits"} for p in pods)
    group = kube.custom.get_namespaced_custom_object("scheduling.k8s.io", "v1alpha2", namespace, "podgroups", "fits")
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    kube.wait_job(namespace, "fits", phase("Running"))
    # 5 ranks of 8 GPUs: more than the whole cluster's 32. Without a gang some would bind and hold GPUs for nothing.
    big = job_manifest("too-big", model={"preset": "gpt2-small"}, pipeline={"stages": 5, "microbatches": 5, "globalBatch": 10},
                       resources={"gpus": 8, "cpu": "1", "memory": "1Gi"}, gpuSharing={"mode": "none"}, scheduling={"gang": "kubernetes"})  # fmt: skip
    kube.create_job(namespace, big)
    pods = kube.wait_pods(namespace, "too-big", _unschedulable(5))
    assert not [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
    assert kube.job(namespace, "too-big")["status"]["phase"] == "Pending"


def test_without_a_gang_the_same_job_binds_what_fits(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    """The control experiment of the test above: the all-or-nothing placement is the gang's doing."""
    start_operator()
    big = job_manifest("too-big", model={"preset": "gpt2-small"}, pipeline={"stages": 5, "microbatches": 5, "globalBatch": 10},
                       resources={"gpus": 8, "cpu": "1", "memory": "1Gi"}, gpuSharing={"mode": "none"})  # fmt: skip
    kube.create_job(namespace, big)

    def some_bound_rest_unschedulable(pods: list[dict[str, Any]]) -> bool:
        bound = [p for p in pods if p["spec"].get("nodeName")]
        rest = [p for p in pods if not p["spec"].get("nodeName")]
        return len(pods) == 5 and bool(bound) and _unschedulable(len(rest))(rest)

    pods = kube.wait_pods(namespace, "too-big", some_bound_rest_unschedulable)
    assert 1 <= len([p for p in pods if p["spec"].get("nodeName")]) <= 3  # the untainted nodes


def test_dra_gives_both_containers_one_claim_allocated_by_the_scheduler(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    kube.create_job(namespace, job_manifest(gpuSharing={"mode": "dra", "mps": {"enabled": True}}))
    pods = kube.wait_pods(namespace, "train", running(2))
    kube.wait_job(namespace, "train", phase("Running"))
    claims = kube.custom.list_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims")["items"]
    assert len(claims) == 2
    by_pod = {c["status"]["reservedFor"][0]["name"]: c for c in claims}
    for pod in pods:
        claim = by_pod[pod["metadata"]["name"]]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["driver"] == "gpu.nvidia.com" and result["pool"] == pod["spec"]["nodeName"]
        trainer, fill = pod["spec"]["containers"][0], pod["spec"]["initContainers"][0]
        assert trainer["resources"]["claims"] == fill["resources"]["claims"] == [{"name": "gpu"}]
    template = kube.custom.get_namespaced_custom_object(
        "resource.k8s.io", "v1", namespace, "resourceclaimtemplates", "train-gpu"
    )
    assert template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"] == {"strategy": "MPS"}
