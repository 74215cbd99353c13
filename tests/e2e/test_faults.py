"""Faults on the real node (`make e2e`): what the kubelet really reports drives the operator.

A trainer killed by SIGKILL exits 137 in the kubelet's words, and the gang restarts from its last checkpoint. A
killed fill executor is restarted in place (a native sidecar) without restarting the gang, and the operator pod
deleted mid-run is replaced by its Deployment: the new one adopts the running job and creates nothing twice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from e2e_harness import Operator, RealCluster, demo_objects, describe_pods, last_logged_step, wait_for

from pipefill.children import JOB_LABEL
from pipefill.pods import GENERATION_LABEL

pytestmark = pytest.mark.e2e
STEPS = 600  # about a minute in pods: long enough to be hit mid-run; a checkpoint every 50 steps


def _job(cluster: RealCluster, namespace: str) -> dict[str, Any]:
    return cluster.get("pipelinetrainingjob", "cpu-demo", namespace)


def _pods(cluster: RealCluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.cp.kubectl("get", "pods", "-n", namespace, "-l", f"{JOB_LABEL}=cpu-demo", "-o", "json").stdout
    pods: list[dict[str, Any]] = json.loads(out)["items"]
    return sorted(pods, key=lambda p: p["metadata"]["name"])


def _run_until(cluster: RealCluster, namespace: str, step: int) -> Callable[[], str]:
    """Start the demo (STEPS steps, a checkpoint every 50, a FillJob it never finishes) and wait until it ran
    ``step`` steps; returns what describes the namespace's pods, for the waits' messages."""
    volumes, job, fill = demo_objects(cluster, namespace, steps=STEPS, total_samples=1 << 20, checkpoint_every=50)
    cluster.apply(volumes)
    cluster.apply([job, fill])
    describe = lambda: describe_pods(cluster, namespace)  # noqa: E731
    wait_for(lambda: _at_step(cluster, namespace, step), f"step {step}", timeout_s=900, describe=describe)
    return describe


def _at_step(cluster: RealCluster, namespace: str, step: int) -> dict[str, Any] | None:
    status = _job(cluster, namespace).get("status", {})
    assert status.get("phase") not in ("Failed", "Succeeded"), f"the job ended before step {step}: {status}"
    return status if status.get("phase") == "Running" and status.get("currentStep", 0) >= step else None


def _succeeded(cluster: RealCluster, namespace: str) -> dict[str, Any] | None:
    status = _job(cluster, namespace).get("status", {})
    assert status.get("phase") != "Failed", f"the job failed: {status}"
    return status if status.get("phase") == "Succeeded" else None


def _container_id(pod: dict[str, Any], name: str) -> str:
    statuses = [*pod["status"].get("initContainerStatuses", []), *pod["status"]["containerStatuses"]]
    (found,) = [s["containerID"] for s in statuses if s["name"] == name]
    return str(found).removeprefix("containerd://")


def _kill(cluster: RealCluster, container_id: str) -> None:
    """SIGKILL the container's process, as the OOM killer or a crash would end it (from the node, not through the
    API: nothing tells the kubelet or the operator beforehand)."""
    node = cluster.cp.real_node
    assert node is not None
    done = node.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)
    assert done.returncode == 0, done.stderr


def _events(cluster: RealCluster, namespace: str) -> str:
    return cluster.cp.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=cpu-demo"
    ).stdout


@pytest.mark.timeout(1800)
def test_a_killed_trainer_restarts_the_gang_from_its_checkpoint(
    real_cluster: RealCluster, operator: Operator, namespace: str
) -> None:
    ns = namespace
    describe = _run_until(real_cluster, ns, 60)  # past the checkpoint of step 50
    victim = _pods(real_cluster, ns)[1]
    _kill(real_cluster, _container_id(victim, "trainer"))
    restarted = wait_for(
        lambda: ((s := _job(real_cluster, ns).get("status", {})).get("restarts", 0) >= 1 and s) or None,
        "the gang restart",
        timeout_s=300,
        describe=describe,
    )
    assert restarted["restarts"] == 1
    events = _events(real_cluster, ns)
    assert "137" in events and "SIGKILL" in events, events
    status = wait_for(
        lambda: _succeeded(real_cluster, ns), "the job Succeeded after the restart", timeout_s=1200, describe=describe
    )
    assert status["restarts"] == 1, status
    pods = _pods(real_cluster, ns)
    assert {p["metadata"]["labels"][GENERATION_LABEL] for p in pods} == {"1"}
    assert last_logged_step(real_cluster, ns, "cpu-demo-0") == STEPS
    log = real_cluster.cp.kubectl("logs", pods[0]["metadata"]["name"], "-n", ns, "-c", "trainer").stdout
    resumed = [int(m) for m in re.findall(r"resumed from \S+ at step (\d+)", log)]
    assert resumed and resumed[0] >= 50 and resumed[0] % 50 == 0, f"not resumed from a checkpoint:\n{log[-3000:]}"


@pytest.mark.timeout(1800)
def test_a_killed_fill_executor_and_a_deleted_operator_pod_leave_the_gang_running(
    real_cluster: RealCluster, operator: Operator, namespace: str
) -> None:
    ns = namespace
    describe = _run_until(real_cluster, ns, 20)
    before = _pods(real_cluster, ns)
    _kill(real_cluster, _container_id(before[0], "fill-executor"))
    real_cluster.cp.kubectl("delete", "pod", operator.pod, "-n", "pipefill-system", "--wait=false")

    def restarted_fill() -> dict[str, Any] | None:
        pod = _pods(real_cluster, ns)[0]
        fill = pod["status"]["initContainerStatuses"][0]
        return pod if fill["restartCount"] >= 1 and fill.get("started") else None

    wait_for(restarted_fill, "the fill executor restarted in place", timeout_s=300, describe=describe)

    def new_operator() -> str | None:
        out = real_cluster.cp.kubectl("get", "pods", "-n", "pipefill-system", "-o", "json").stdout
        for pod in json.loads(out)["items"]:
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
            if pod["metadata"]["name"] != operator.pod and ready:
                return str(pod["metadata"]["name"])
        return None

    operator.pod = wait_for(new_operator, "a new operator pod Ready", timeout_s=300, describe=describe)
    status = wait_for(lambda: _succeeded(real_cluster, ns), "the job Succeeded", timeout_s=1200, describe=describe)
    assert status.get("restarts", 0) == 0, status
    assert last_logged_step(real_cluster, ns, "cpu-demo-0") == STEPS  # rank 0 logs the steps
    after = _pods(real_cluster, ns)
    assert [p["metadata"]["uid"] for p in after] == [p["metadata"]["uid"] for p in before], "no pod made twice"
    filljob = real_cluster.get("filljob", "embed-corpus", ns)["status"]
    assert sum(s["committed"] - s["start"] for s in filljob.get("slices", [])) > 0, filljob
