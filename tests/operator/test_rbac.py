"""RBAC from evidence: the ClusterRole in operator/rbac/clusterrole.yaml is exactly what the operator's requests in a
run that touches every kind of object need (as the audit log records them), and the operator runs that scenario
under a ServiceAccount bound to that ClusterRole without a single 403.

Regenerate the file after a change that makes the operator call something new: PIPEFILL_WRITE_RBAC=1 pytest
tests/operator/test_rbac.py (then review the diff).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from fill_queue_helpers import Fill, assigned, fill_manifest
from kubernetes import client
from operator_harness import (
    OPERATOR_NAMESPACE,
    ROLE_FILE,
    Kube,
    OperatorProcess,
    committed_role,
    condition,
    install_identity,
    job_manifest,
    operator_requests,
    phase,
    running,
    serving,
)
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from waiting import wait_for

from pipefill.devcluster import ControlPlane
from pipefill_operator.rbac import cluster_role, rules_from_audit

pytestmark = pytest.mark.cluster

SCHEDULE_CSV = "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"


@contextmanager
def _serve_trainer_metrics(pods: list[dict[str, Any]], step: int) -> Iterator[None]:
    """Stand in for the trainers: a metrics endpoint on each pod's IP and trainer port (all on loopback)."""
    servers = []
    for pod in pods:
        registry = CollectorRegistry()
        Gauge("pipefill_trainer_step", "", registry=registry).set(step)
        port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
        servers.append(start_http_server(port, addr=pod["status"]["podIP"], registry=registry))
    with serving(servers):
        yield


def _scenario(cp: ControlPlane, kube: Kube, namespace: str, operator: OperatorProcess) -> None:
    """Every path that calls the API: children of every kind, waiting (for a ConfigMap, for a claim), restart, status from the ranks, Events,
    InvalidSpec, TTL deletion, a FillJob placed by the queue, and a restart of the operator (it then finds its
    children and updates them)."""
    cp.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"ckpt-{namespace}"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "hostPath": {"path": f"/tmp/{namespace}"},
                    "claimRef": {"namespace": namespace, "name": "ckpt"},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "ckpt", "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "resources": {"requests": {"storage": "1Gi"}},
                    "storageClassName": "",
                },
            },
        ]
    )
    full = job_manifest(
        "full",
        pipeline={"stages": 2, "microbatches": 4, "globalBatch": 8, "schedule": "custom",
                  "customSchedule": {"name": "order"}},
        gpuSharing={"mode": "dra"},
        checkpoint={"path": "/ckpt", "claimName": "ckpt"},
        scheduling={"gang": "kubernetes", "podDisruptionBudget": True},
        runPolicy={"ttlSecondsAfterFinished": 0, "terminationGracePeriodSeconds": 5},
    )  # fmt: skip
    kube.create_job(namespace, full)
    kube.create_job(namespace, job_manifest("restart"))
    # a claim not there yet: the operator lists and watches that one claim until it is
    kube.create_job(namespace, job_manifest("late", checkpoint={"path": "/ckpt", "claimName": "late"}))
    # the fill queue: lists and watches FillJobs, writes their status (plan, assignments, condition)
    fill = Fill(kube, namespace)
    fill.create(fill_manifest("embed"))
    invalid = {"stages": 2, "microbatches": 4, "globalBatch": 8, "layersPerStage": [1, 1]}  # admission accepts it
    kube.create_job(namespace, job_manifest("invalid", pipeline=invalid))
    kube.wait_job(namespace, "full", phase("Waiting"))
    kube.wait_job(namespace, "late", phase("Waiting"))
    # the claim comes only once the operator watches for it: a claim there before its list would need no watch, and
    # the role derived from such a run would miss the verb (seen in a full run)
    wait_for(lambda: _watched(cp, namespace, "persistentvolumeclaims"), "the operator watching the late claim", 60)
    claim = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": ""}
    cp.apply([{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "late", "namespace": namespace},
               "spec": claim}])  # fmt: skip
    kube.wait_job(namespace, "late", lambda j: (j.get("status") or {}).get("phase") != "Waiting")
    kube.wait_job(namespace, "invalid", lambda j: (condition(j, "InvalidSpec") or {}).get("status") == "True")
    pods = kube.wait_pods(namespace, "restart", running(2))
    fill.wait("embed", assigned(1))
    kube.end_trainer(namespace, pods[0]["metadata"]["name"], 75, "peer gone")
    pods = kube.wait_pods(namespace, "restart", running(2, generation=1))
    with _serve_trainer_metrics(pods, step=12):
        kube.wait_job(namespace, "restart", lambda j: (j.get("status") or {}).get("currentStep") == 12)
    cp.apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "order", "namespace": namespace},
               "data": {"schedule.csv": SCHEDULE_CSV}}])  # fmt: skip
    full_pods = kube.wait_pods(namespace, "full", running(2), timeout_s=90)
    operator.stop()
    operator.start()
    kube.end_trainer(namespace, pods[1]["metadata"]["name"], 137)
    kube.wait_pods(namespace, "restart", running(2, generation=2))
    # the restarted operator finds the spec ConfigMap of the custom schedule's job (the one job kind that still has
    # one) and brings it up to date before that job's next gang
    kube.end_trainer(namespace, full_pods[0]["metadata"]["name"], 75, "peer gone")
    full_pods = kube.wait_pods(namespace, "full", running(2, generation=1), timeout_s=90)
    for pod in full_pods:
        kube.end_trainer(namespace, pod["metadata"]["name"], 0)
    kube.wait_job_gone(namespace, "full")


def _watched(cp: ControlPlane, namespace: str, resource: str) -> bool:
    """Whether the audit log holds a watch of ``resource`` in ``namespace``."""
    refs = [e.get("objectRef") for e in cp.audit_events() if e.get("verb") == "watch"]
    return any(isinstance(r, dict) and (r.get("resource"), r.get("namespace")) == (resource, namespace) for r in refs)


def _run(cp: ControlPlane, kube: Kube, kubeconfig: Path, log: Path, namespace: str) -> None:
    """The scenario in a namespace of its own (deleted after), under an operator with ``kubeconfig``'s identity."""
    cp.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(kubeconfig, log, status_interval_s=1.0)
    operator.start()
    try:
        _scenario(cp, kube, namespace, operator)
    finally:
        operator.stop()
        cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_the_committed_cluster_role_is_what_the_operator_uses(
    control_plane: ControlPlane, kube: Kube, tmp_path: Path
) -> None:
    name = "pipefill-operator-audit"
    kubeconfig = install_identity(control_plane, name, None)  # cluster-admin: every request succeeds and is seen
    _run(control_plane, kube, kubeconfig, tmp_path / "derive.log", "rbac-derive")
    user = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{name}"
    derived = cluster_role(rules_from_audit(control_plane.audit_events(), user))
    (tmp_path / "clusterrole.yaml").write_text(yaml.safe_dump(derived, sort_keys=False))
    if os.environ.get("PIPEFILL_WRITE_RBAC") == "1":
        header = "".join(line + "\n" for line in ROLE_FILE.read_text().splitlines() if line.startswith("#"))
        ROLE_FILE.write_text(header + yaml.safe_dump(derived, sort_keys=False))
    assert derived["rules"] == committed_role()["rules"], (
        f"the operator's requests need other rules than {ROLE_FILE}: compare with {tmp_path / 'clusterrole.yaml'} "
        "and regenerate with PIPEFILL_WRITE_RBAC=1"
    )


def test_the_operator_runs_everything_under_the_committed_role_without_a_403(
    control_plane: ControlPlane, kube: Kube, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    namespace = "rbac-check"
    _run(control_plane, kube, operator_kubeconfig, tmp_path / "check.log", namespace)
    user = f"system:serviceaccount:{OPERATOR_NAMESPACE}:pipefill-operator"
    requests = operator_requests(control_plane, user, namespace=namespace)
    assert len(requests) > 20  # it did work there
    denied = [e for e in requests if (e.get("responseStatus") or {}).get("code") == 403]
    assert denied == [], [(e["verb"], e.get("objectRef")) for e in denied]
    assert client.RbacAuthorizationV1Api(kube.api).read_cluster_role_binding("pipefill-operator")
