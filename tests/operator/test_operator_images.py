"""Rank pods whose containers cannot start, on the real control plane: the scheduler binds the pods, the test plays
their kubelet from the start (kwok leaves pods annotated ``MANUAL_KUBELET`` alone) — a pull that fails, the kubelet's
back-off, a container it cannot create, then every container running — and the operator as its own process reports it
on the job: the StartBlocked condition and one Warning Event per distinct problem, cleared when the pods start."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from operator_harness import Kube, OperatorProcess, condition, job_manifest, phase

from pipefill.devcluster import ControlPlane
from pipefill.devcluster.kwok import MANUAL_KUBELET

pytestmark = pytest.mark.cluster

IMAGE = "registry.example/team/trainer:v9"
FILL_IMAGE = "ghcr.io/pipefill/fill:0.1.0"
PULL_ERROR = f'failed to pull and unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": not found'
NOW = "2026-03-01T12:00:00Z"


def _waiting(name: str, image: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "name": name, "image": image, "imageID": "", "ready": False, "restartCount": 0, "started": False,
        "state": {"waiting": {"reason": reason, "message": message}},
    }  # fmt: skip


def _running(name: str, image: str) -> dict[str, Any]:
    return {
        "name": name, "image": image, "imageID": "", "ready": True, "restartCount": 0, "started": True,
        "state": {"running": {"startedAt": NOW}},
    }  # fmt: skip


def _kubelet_says(kube: Kube, namespace: str, pod: str, trainer: dict[str, Any], fill: dict[str, Any]) -> None:
    """Write ``pod``'s status as its kubelet would: Running with its conditions True once both containers run,
    else Pending with the containers not ready."""
    runs = "running" in trainer["state"] and "running" in fill["state"]
    ready = "True" if runs else "False"
    status = {
        "phase": "Running" if runs else "Pending",
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": NOW},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": NOW},
            {"type": "Ready", "status": ready, "lastTransitionTime": NOW},
        ],
        "containerStatuses": [trainer],
        "initContainerStatuses": [fill],
    }
    kube.core.patch_namespaced_pod_status(pod, namespace, {"status": status})


def _blocked(status: str) -> Callable[[dict[str, Any]], bool]:
    return lambda job: (condition(job, "StartBlocked") or {}).get("status") == status


def test_pods_that_cannot_pull_their_image_are_reported_once_and_cleared_when_they_start(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    manual = {"annotations": {MANUAL_KUBELET: "true"}}
    kube.create_job(namespace, job_manifest(trainerImage=IMAGE, fillImage=FILL_IMAGE, podTemplate=manual))
    pods = kube.wait_pods(namespace, "train", lambda ps: len(ps) == 2 and all(p["spec"].get("nodeName") for p in ps))
    names = sorted(p["metadata"]["name"] for p in pods)
    assert names == ["train-0", "train-1"]
    fill_runs = _running("fill-executor", FILL_IMAGE)
    for name in names:
        _kubelet_says(kube, namespace, name, _waiting("trainer", IMAGE, "ErrImagePull", PULL_ERROR), fill_runs)

    job = kube.wait_job(namespace, "train", _blocked("True"))
    blocked = condition(job, "StartBlocked") or {}
    assert blocked["reason"] == "ImagePullFailed" and job["status"]["phase"] == "Pending"
    for part in (f'container trainer cannot pull image "{IMAGE}"', "rank 0 (pod train-0)", PULL_ERROR):
        assert part in blocked["message"], part
    for fix in ("spec.trainerImage", "spec.podTemplate.imagePullSecrets", "reach the registry"):
        assert fix in blocked["message"], fix
    (pulled,) = kube.wait_events(namespace, {"ImagePullFailed"})
    assert pulled["type"] == "Warning" and "pod train-0" in pulled["message"] and PULL_ERROR in pulled["message"]

    # the kubelet's back-off on rank 1 (the same problem), then a new one on rank 0, written after it: its sidecar
    # cannot be created (so its trainer waits for it). The new problem's Event shows that the operator saw rank 0's
    # write, and so rank 1's before it on the same watch.
    back_off = _waiting("trainer", IMAGE, "ImagePullBackOff", f'Back-off pulling image "{IMAGE}": ErrImagePull: x')
    no_secret = _waiting("fill-executor", FILL_IMAGE, "CreateContainerConfigError", 'secret "hf-token" not found')
    _kubelet_says(kube, namespace, "train-1", back_off, fill_runs)
    _kubelet_says(kube, namespace, "train-0", _waiting("trainer", IMAGE, "PodInitializing", ""), no_secret)
    (config,) = kube.wait_events(namespace, {"ContainerConfigError"})
    assert config["type"] == "Warning" and 'secret "hf-token" not found' in config["message"]
    assert "pod train-0" in config["message"] and "Secrets" in config["message"]
    job = kube.wait_job(
        namespace, "train", lambda j: "fill-executor" in (condition(j, "StartBlocked") or {}).get("message", "")
    )
    assert "rank 1 (pod train-1): ImagePullBackOff" in (condition(job, "StartBlocked") or {})["message"]

    for name in names:
        _kubelet_says(kube, namespace, name, _running("trainer", IMAGE), fill_runs)
    job = kube.wait_job(namespace, "train", lambda j: _blocked("False")(j) and phase("Running")(j))
    assert (condition(job, "StartBlocked") or {})["reason"] == "ContainersStarted"
    events = kube.core.list_namespaced_event(namespace, field_selector="involvedObject.kind=PipelineTrainingJob")
    ours = sorted(e.reason for e in events.items if e.reason in ("ContainerConfigError", "ImagePullFailed"))
    assert ours == ["ContainerConfigError", "ImagePullFailed"]  # one each: no Event for the back-off
