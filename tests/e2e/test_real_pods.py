"""The product on a real node (`make e2e`): the operator installed by helm runs as a pod, and a 2-rank CPU demo with
an inference FillJob runs as real rank pods, trainer and fill executor in their own containers sharing the bubble
channel through the pod's memory emptyDir, until the job Succeeded with its loss fallen and the FillJob done once."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import numpy as np
import pytest
from e2e_harness import FILL_OUTPUT, Operator, RealCluster, demo_objects, describe_pods, last_logged_step, wait_for
from e2e_prometheus import Prometheus

from pipefill.children import JOB_LABEL
from pipefill.devcluster.nodeconf import NODE_IP
from pipefill.pods import CHANNEL_MOUNT

pytestmark = pytest.mark.e2e
STEPS, SAMPLES = 600, 4096  # `make demo` runs 60 steps in about 5 s and fills 2 464 samples in them


def _pods(cluster: RealCluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.cp.kubectl("get", "pods", "-n", namespace, "-l", f"{JOB_LABEL}=cpu-demo", "-o", "json").stdout
    pods: list[dict[str, Any]] = json.loads(out)["items"]
    return pods


def _both_containers_run(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    fill = status.get("initContainerStatuses") or [{}]
    trainer = status.get("containerStatuses") or [{}]
    return bool(fill[0].get("started")) and "running" in trainer[0].get("state", {})


def _ls(cluster: RealCluster, namespace: str, pod: str, container: str) -> list[str]:
    done = cluster.cp.kubectl("exec", pod, "-n", namespace, "-c", container, "--", "ls", "-A", CHANNEL_MOUNT)
    return sorted(done.stdout.split())


def _same_channel(cluster: RealCluster, namespace: str, pod: str) -> list[str] | None:
    trainer = _ls(cluster, namespace, pod, "trainer")
    return trainer if trainer and trainer == _ls(cluster, namespace, pod, "fill-executor") else None


@pytest.mark.timeout(1800)
def test_the_cpu_demo_trains_and_fills_its_bubbles_in_real_pods(
    real_cluster: RealCluster, operator: Operator, prometheus: Prometheus, namespace: str
) -> None:
    ns = namespace
    operator_pod = real_cluster.get("pod", operator.pod, "pipefill-system")
    assert operator_pod["spec"]["nodeName"] == NODE_IP, "the operator runs on the real node"
    assert operator_pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    volumes, job, fill = demo_objects(real_cluster, ns, steps=STEPS, total_samples=SAMPLES)
    real_cluster.apply(volumes)
    real_cluster.apply([job, fill])
    describe = lambda: describe_pods(real_cluster, ns)  # noqa: E731

    def running() -> list[dict[str, Any]] | None:
        pods = _pods(real_cluster, ns)
        return pods if len(pods) == 2 and all(_both_containers_run(p) for p in pods) else None

    pods = wait_for(running, "both rank pods running their trainer and fill executor", timeout_s=300, describe=describe)
    assert {p["spec"]["nodeName"] for p in pods} == {NODE_IP}
    # One bubble channel per pod, in its memory emptyDir: what the trainer writes there the fill executor sees.
    for pod in pods:
        name = pod["metadata"]["name"]
        wait_for(
            lambda name=name: _same_channel(real_cluster, ns, name),
            f"{name}: the same channel files in both containers",
            timeout_s=120,
        )

    # Prometheus scrapes both containers of both pods where they run, the targets found as the PodMonitor finds them.
    assert prometheus.discover(_pods(real_cluster, ns)) == 4

    def scraped() -> list[dict[str, Any]] | None:
        got = prometheus.query(
            "sum by (rank, container) (pipefill_trainer_steps_total or pipefill_fill_bubbles_seen_total)"
        )
        return got if len(got) == 4 else None

    series = wait_for(scraped, "4 scraped containers (trainer and fill executor of 2 ranks)", timeout_s=180)
    assert {(s["metric"]["rank"], s["metric"]["container"]) for s in series} == {
        (rank, container) for rank in ("0", "1") for container in ("trainer", "fill-executor")
    }
    loss = prometheus.query(f'pipefill_trainer_loss{{training_job="cpu-demo",namespace="{ns}"}}')
    assert loss, "the trainers' loss, scraped with the labels the dashboards select on"

    def finished() -> dict[str, Any] | None:
        obj = real_cluster.get("pipelinetrainingjob", "cpu-demo", ns)
        phase = obj.get("status", {}).get("phase")
        assert phase != "Failed", f"the job failed: {obj['status']}\n{describe()}"
        return obj if phase == "Succeeded" else None

    done = wait_for(finished, "the job Succeeded", timeout_s=1200, describe=describe)
    status = done["status"]
    # the operator's final word, not the last metrics read (taken every few seconds while the trainers ran)
    assert (status["currentStep"], status["progress"], status.get("restarts", 0)) == (STEPS, 100.0, 0), status
    assert status["loss"] < 0.8 * math.log(256), f"the loss did not fall from ln(256): {status['loss']}"
    for pod in _pods(real_cluster, ns):  # the real kubelet's word: the trainer exited 0, the sidecar was stopped
        trainer = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert trainer["exitCode"] == 0, trainer

    assert last_logged_step(real_cluster, ns, "cpu-demo-0") == STEPS  # rank 0 logs the steps
    # the FillJob: done once, by whichever rank finished last (a Succeeded job's outputs are assembled)
    filljob = wait_for(
        lambda: (s := real_cluster.get("filljob", "embed-corpus", ns)["status"]).get("phase") == "Succeeded" and s,
        "the FillJob Succeeded",
        timeout_s=300,
        describe=lambda: json.dumps(real_cluster.get("filljob", "embed-corpus", ns).get("status"), indent=1),
    )
    slices = sorted((s["start"], s["end"], s["committed"]) for s in filljob.get("slices", []))
    assert all(a[1] == b[0] for a, b in itertools.pairwise(slices)), f"slices leave a gap or overlap: {slices}"
    assert slices[0][0] == 0 and slices[-1][1] == SAMPLES and all(c == e for _, e, c in slices), slices
    assert filljob["samplesDone"] == SAMPLES, filljob
    outputs = np.load(real_cluster.root / ns / "fill-storage" / FILL_OUTPUT / "outputs.npy")
    assert outputs["sample_id"].tolist() == list(range(SAMPLES)), "every sample once, in order"
