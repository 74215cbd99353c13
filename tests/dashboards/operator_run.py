"""The operator as a real process on the real control plane, with work to show on its dashboard rows.

It runs under a ServiceAccount bound to the committed ClusterRole (tests/operator's harness, reused), serves one
fresh namespace and is given two PipelineTrainingJobs there: one it runs (its rank pods are bound and set Running
by kwok) and one only it can refuse (a layer cut that does not add up: reconciled with result ``invalid``, so the
error series exist); and the demo's FillJob, which its fill queue keeps Queued (no training job there has fill
storage to host it). kwok runs no container, so the operator's scrapes of the rank pods for status fail (counted as
``error``), as they would for pods whose trainer has not started.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "operator"))  # the operator tests' harness: one way to run the operator

import operator_harness as harness  # noqa: E402

from pipefill.devcluster import ControlPlane  # noqa: E402

__all__ = ["OPERATOR_NAMESPACE_LABEL", "OperatorRun", "operator_with_jobs"]

OPERATOR_NAMESPACE_LABEL = "pipefill-system"
"""The ``namespace`` a ServiceMonitor's scrape gives the operator's series: the operator's own, not its jobs'."""


class OperatorRun:
    """The operator process: started first (its metrics port is bound right after it was found free, so nothing on
    this shared machine takes it while Prometheus starts), given its jobs once Prometheus scrapes it."""

    def __init__(self, cp: ControlPlane, tmp: Path) -> None:
        self.cp = cp
        self.namespace = f"dash-{uuid.uuid4().hex[:8]}"
        kubeconfig = harness.install_identity(cp, "pipefill-operator-dashboards", harness.committed_role())
        self.process = harness.OperatorProcess(kubeconfig, tmp / "operator.log", namespaces=(self.namespace,))
        self.metrics_port = self.process.metrics_port

    def start(self) -> None:
        self.cp.kubectl("create", "namespace", self.namespace)
        try:
            self.process.start()
        except AssertionError as exc:  # say why: the log is in a temporary directory that may be gone by then
            tail = "\n".join(self.process.log_text().splitlines()[-20:])
            raise AssertionError(f"{exc}\n{tail}") from None

    def create_jobs(self) -> None:
        """The two training jobs and the FillJob; returns once the operator has run one job, refused the other and
        queued the FillJob."""
        kube = harness.Kube(self.cp)
        kube.create_job(self.namespace, harness.job_manifest("runs"))
        bad_cut = {"stages": 2, "microbatches": 4, "globalBatch": 8, "layersPerStage": [1, 1]}
        kube.create_job(self.namespace, harness.job_manifest("refused", pipeline=bad_cut))
        fill = yaml.safe_load((ROOT / "examples" / "fill-inference.yaml").read_text())
        kube.custom.create_namespaced_custom_object("pipefill.io", "v1alpha1", self.namespace, "filljobs", fill)
        kube.wait_pods(self.namespace, "runs", harness.running(2))
        kube.wait_job(
            self.namespace, "refused", lambda j: (harness.condition(j, "InvalidSpec") or {}).get("status") == "True"
        )
        name = fill["metadata"]["name"]
        self.cp.kubectl("wait", f"filljob/{name}", "-n", self.namespace, "--for=jsonpath={.status.phase}=Queued")

    def stop(self) -> None:
        self.process.stop()
        self.cp.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)


@contextmanager
def operator_with_jobs(cp: ControlPlane, tmp: Path) -> Iterator[OperatorRun]:
    """The operator started; its jobs come with :meth:`OperatorRun.create_jobs`."""
    run = OperatorRun(cp, tmp)
    try:
        run.start()
        yield run
    finally:
        run.stop()
