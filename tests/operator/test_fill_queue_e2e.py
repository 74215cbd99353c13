"""The queue end to end: the operator places a split FillJob on the rank pods of one training job, real fill
executors (``python -m pipefill_fill``, the Kubernetes work source, one per rank pod, each on a live channel fed by
the synthetic trainer) run its slices in their bubbles, the host training job is deleted midway (its executors die
with it), the operator moves the unfinished slices to the other training job's pods, whose executors resume them
from their commit pointers. The result is byte-identical to the job run whole in one process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fill_queue_helpers import Fill, fill_manifest, start_queue_operator, status
from operator_harness import GROUP, VERSION, Kube, OperatorProcess, job_manifest, phase, running

from pipefill import env
from pipefill.children import fill_account_name
from pipefill.devcluster import ControlPlane
from pipefill.spec import FillJob, parse
from pipefill_fill.task import FillTask, TaskSpec

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(600)]

# ~1 ms a step of 4 on one core; a commit every 64 samples leaves slices half done when the host goes
PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "batchSizes": [1, 4], "commitEverySamples": 64}
TOTAL = 2048  # 8 slices of 256 with maxParallelRanks 2


def _manifest(out: Path) -> dict[str, Any]:
    workload = {"kind": "inference", "builtin": "encoder-inference", "parameters": PARAMS}
    return fill_manifest("embed", workload=workload, output={"path": str(out)}, totalSamples=TOTAL, maxParallelRanks=2)


def _reference(tmp: Path) -> bytes:
    """outputs.npy of the same job run whole, in this process."""
    job = parse(_manifest(tmp / "reference"))
    assert isinstance(job, FillJob)
    task = FillTask(TaskSpec.from_spec(job))
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    while not task.done():
        task.step(64)
    assert task.finish()
    return (tmp / "reference" / "outputs.npy").read_bytes()


class Rank:
    """One rank pod's processes: the synthetic trainer on a channel and the fill executor attached to it."""

    def __init__(self, cp: ControlPlane, namespace: str, pod: dict[str, Any], tmp: Path) -> None:
        meta = pod["metadata"]
        self.name, job = meta["name"], meta["labels"]["pipefill.io/job-name"]
        channel, out = tmp / self.name / "channel", tmp / self.name / "out"
        channel.mkdir(parents=True)
        child = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
        self.trainer = subprocess.Popen(
            [sys.executable, "-m", "pipefill.bench.synthetic_trainer", "--channel-dir", str(channel),
             "--bubbles-ms", "20", "--compute-ms", "2", "--count", "100000"],
            env=child, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        kubeconfig = cp.kubeconfig_for(namespace, fill_account_name(_ptj(job)))
        self.log = (tmp / f"{self.name}.log").open("w")
        self.executor = subprocess.Popen(
            [sys.executable, "-m", "pipefill_fill"],
            env={
                **child,
                "KUBECONFIG": str(kubeconfig),
                "HOSTNAME": self.name,
                env.POD_NAMESPACE: namespace,
                env.POD_UID: meta["uid"],
                env.JOB_NAME: job,
                env.RANK: meta["labels"]["pipefill.io/rank"],
                env.CHANNEL_DIR: str(channel),
                env.WORK_SOURCE: "kubernetes",
                env.DEVICE: "cpu",
                env.FILL_GUARD_MS: "1",
                env.OUT_DIR: str(out),
            },
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        """The pod is gone: its processes die with it."""
        for proc in (self.executor, self.trainer):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        self.log.close()

    def stop(self) -> int:
        """The trainer ends; the executor follows (exit 0: trainer gone)."""
        if self.trainer.poll() is None:
            self.trainer.send_signal(signal.SIGTERM)
        self.trainer.wait(timeout=30)
        code = self.executor.wait(timeout=60)
        self.log.close()
        return code


def _ptj(name: str) -> Any:
    return parse(job_manifest(name))


@pytest.fixture
def ranks() -> Iterator[list[Rank]]:
    started: list[Rank] = []
    yield started
    for rank in started:
        rank.kill()


def test_a_split_job_survives_its_host_being_deleted_and_matches_a_single_rank_run(
    control_plane: ControlPlane,
    kube: Kube,
    namespace: str,
    operator_kubeconfig: Path,
    tmp_path: Path,
    ranks: list[Rank],
) -> None:
    reference = _reference(tmp_path)
    operator: OperatorProcess = start_queue_operator(operator_kubeconfig, tmp_path / "operator.log", namespace)
    with _explained(tmp_path):
        _run(control_plane, kube, namespace, tmp_path, ranks, reference, operator)


@contextlib.contextmanager
def _explained(tmp: Path) -> Iterator[None]:
    """A failure carries the end of every process's log (the test's tmp directory does not outlive a few runs)."""
    try:
        yield
    except AssertionError as exc:
        tails = [f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-15:]) for p in sorted(tmp.glob("*.log"))]
        raise AssertionError(f"{exc}\n" + "\n".join(tails)) from exc


def _run(
    control_plane: ControlPlane,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    ranks: list[Rank],
    reference: bytes,
    operator: OperatorProcess,
) -> None:
    try:
        by_job: dict[str, list[Rank]] = {}
        for name in ("first", "second"):
            kube.create_job(namespace, job_manifest(name))
            pods = kube.wait_pods(namespace, name, running(2))
            kube.wait_job(namespace, name, phase("Running"))
            by_job[name] = [Rank(control_plane, namespace, p, tmp_path) for p in pods]
            ranks.extend(by_job[name])
        fill = Fill(kube, namespace)
        out = tmp_path / "out"
        fill.create(_manifest(out))
        obj = fill.wait("embed", lambda o: len(status(o).get("assignments") or ()) == 2)
        host = status(obj)["assignments"][0]["trainingJob"]
        other = "second" if host == "first" else "first"

        # some work committed on the host, then it goes: deleted, its pods gone, their processes killed
        def started(o: dict[str, Any]) -> bool:
            return 300 <= int(status(o).get("samplesDone") or 0) < TOTAL - 512

        fill.wait("embed", started, timeout_s=240)
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "pipelinetrainingjobs", host)
        for rank in by_job[host]:
            rank.kill()
        obj = fill.wait("embed", phase("Succeeded"), timeout_s=240)
        assert {a["trainingJob"] for a in status(obj).get("assignments") or ()} <= {other}
        assert status(obj)["samplesDone"] == TOTAL and status(obj)["epoch"] > 2
        for rank in by_job[other]:
            assert rank.stop() == 0
        assert (out / "outputs.npy").read_bytes() == reference
    finally:
        operator.stop()
