"""The chart on a real API server: every rendered object created with a server-side dry run, and a real
`helm install` → `helm upgrade` → `helm uninstall`. kwok does not run the chart's Deployment, so the operator runs as
a process with the Deployment's own arguments and the token of the ServiceAccount the chart created: the chart's
RBAC is what is tested (a missing verb is a 403 in the audit log, or a job that never runs).
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_harness import (
    CHART,
    MONITORING,
    RELEASE_NAMESPACE,
    DeployedOperator,
    by_kind,
    helm,
    local_args,
    one,
    render,
    values_file,
)
from kubernetes import client
from operator_harness import (
    GROUP,
    PLURAL,
    VERSION,
    Kube,
    condition,
    custom_pipeline,
    job_manifest,
    operator_requests,
    phase,
    running,
)
from waiting import wait_for

from pipefill.devcluster import ControlPlane
from pipefill.lifecycle.checks import checkpoint_sharing
from pipefill.spec import KINDS, crd, parse

pytestmark = pytest.mark.cluster

CRD_NAMES = sorted(crd(kind)["metadata"]["name"] for kind in KINDS)
PTJ_CRD = crd("PipelineTrainingJob")["metadata"]["name"]


def _delete_crds(cp: ControlPlane) -> None:
    """Start from a cluster without the CRDs (and so without any job), as a first install does."""
    cp.kubectl("delete", "crd", *CRD_NAMES, "--ignore-not-found", "--wait=true", "--timeout=120s")


def _namespaces(cp: ControlPlane, *names: str) -> None:
    cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in names])


def _install(cp: ControlPlane, verb: str, release: str, chart: Path, values: dict[str, Any], tmp: Path) -> str:
    args = [verb, release, str(chart), "--namespace", RELEASE_NAMESPACE, "-f", str(values_file(values, tmp))]
    return helm(*args, kubeconfig=cp.kubeconfig).stdout


def _deployment(cp: ControlPlane, release: str) -> dict[str, Any]:
    out = cp.kubectl("get", "deployment", f"{release}-pipefill-operator", "-n", RELEASE_NAMESPACE, "-o", "json")
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def _operator(cp: ControlPlane, release: str, log: Path) -> tuple[DeployedOperator, dict[str, str]]:
    """The operator as the chart's pod would run it (the Deployment's arguments, its ServiceAccount's token), and
    the URLs of its endpoints."""
    deployment = _deployment(cp, release)
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    args, urls = local_args(deployment)
    return DeployedOperator(args, cp.kubeconfig_for(RELEASE_NAMESPACE, account), log), urls


def _get(url: str, *, timeout_s: float = 30) -> str:
    """GET ``url`` (200 expected). kopf binds its liveness endpoint a moment after the operator says it is ready,
    and a socket's binding is no event one can wait on: a refused connection is retried until ``timeout_s``."""

    def get() -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                assert response.status == 200, url
                text: str = response.read().decode()
                return text
        except urllib.error.URLError as exc:
            if not isinstance(exc.reason, ConnectionRefusedError):
                raise
            return None

    return wait_for(get, f"{url} to accept connections", timeout_s, interval_s=0.1, until=lambda text: text is not None)


def _denied(cp: ControlPlane, account: str) -> list[tuple[str, Any]]:
    user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{account}"
    requests = operator_requests(cp, user)
    assert len(requests) > 5, f"no requests of {user} in the audit log"
    return [(e["verb"], e.get("objectRef")) for e in requests if (e.get("responseStatus") or {}).get("code") == 403]


def test_every_rendered_object_is_created_by_a_server_side_dry_run(chart_plane: ControlPlane, tmp_path: Path) -> None:
    cp = chart_plane
    _delete_crds(cp)
    _namespaces(cp, RELEASE_NAMESPACE, "team-a", "team-b", "grafana")
    combinations: list[dict[str, Any]] = [
        {"dashboards": {"enabled": True}},
        {
            "operator": {"namespaces": ["team-a", "team-b"], "ipFamily": "IPv6"},
            "dashboards": {"enabled": True, "namespace": "grafana"},
            "monitoring": {
                "serviceMonitor": {"enabled": True},
                "podMonitor": {"enabled": True},
                "prometheusRule": {"enabled": True},
            },
        },
        {"crds": {"keep": False}, "operator": {"metrics": {"enabled": False}, "liveness": {"enabled": False}}},
        {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "op"}, "operator": {"replicas": 0}},
    ]
    rendered_only = set()
    for values in combinations:
        objs = render(values, tmp_path, api_versions=(MONITORING,))
        checked = [o for o in objs if not o["apiVersion"].startswith("monitoring.coreos.com/")]
        rendered_only |= {o["kind"] for o in objs if o not in checked}
        docs = yaml.safe_dump_all(checked, sort_keys=False)
        out = cp.kubectl("create", "--dry-run=server", "--validate=strict", "-o", "name", "-f", "-", stdin=docs)
        created = out.stdout.split()
        assert len(created) == len(checked), (values, out.stdout, out.stderr)
    # The Prometheus Operator's API is not served here: its objects are checked in test_chart_render only.
    assert rendered_only == {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


def _old_chart(tmp: Path) -> Path:
    """The chart as an earlier version: its PipelineTrainingJob CRD had no category yet."""
    old = tmp / "old-chart"
    shutil.copytree(CHART, old)  # the link to the operator's ClusterRole is copied as the file it points to
    chart_yaml = old / "Chart.yaml"
    chart_yaml.write_text(chart_yaml.read_text().replace("version: 0.1.0", "version: 0.0.9"))
    template = old / "templates" / "crds" / f"{crd('PipelineTrainingJob')['spec']['group']}_pipelinetrainingjobs.yaml"
    text = template.read_text()
    assert "    categories:\n    - pipefill\n" in text
    template.write_text(text.replace("    categories:\n    - pipefill\n", ""))
    return old


@pytest.mark.timeout(240)
def test_install_upgrade_uninstall_keeps_the_crds_and_the_users_jobs(chart_plane: ControlPlane, tmp_path: Path) -> None:
    cp, kube = chart_plane, Kube(chart_plane)
    _delete_crds(cp)
    _namespaces(cp, RELEASE_NAMESPACE, "users")
    _install(cp, "install", "pf", _old_chart(tmp_path), {}, tmp_path)
    installed = json.loads(cp.kubectl("get", "crd", PTJ_CRD, "-o", "json").stdout)
    assert "categories" not in installed["spec"]["names"]

    values = {"operator": {"workers": 2, "statusIntervalSeconds": 1}}
    notes = _install(cp, "upgrade", "pf", CHART, values, tmp_path)
    assert "It serves all namespaces." in notes and "The CRDs are kept on `helm uninstall`" in notes
    upgraded = json.loads(cp.kubectl("get", "crd", PTJ_CRD, "-o", "json").stdout)
    assert upgraded["spec"]["names"]["categories"] == ["pipefill"]  # helm upgrade upgrades the CRDs
    assert upgraded["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    history = json.loads(helm("history", "pf", "-n", RELEASE_NAMESPACE, "-o", "json", kubeconfig=cp.kubeconfig).stdout)
    assert [(h["revision"], h["chart"]) for h in history] == [(1, "pipefill-0.0.9"), (2, "pipefill-0.1.0")]
    deployment = _deployment(cp, "pf")
    assert "--workers=2" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    operator, urls = _operator(cp, "pf", tmp_path / "operator.log")
    operator.start()
    try:
        # The chart's admission policy warns whoever applies a job whose restart would not find its checkpoints,
        # in the operator's words; the operator then records it in the condition and posts no Event of its own.
        applied = cp.kubectl("apply", "-n", "users", "-f", "-", stdin=yaml.safe_dump(job_manifest("train")))
        _, _, no_claim = checkpoint_sharing(parse(job_manifest("train")), None)
        warning = " ".join(applied.stderr.split())
        assert warning.startswith("Warning: Validation failed for ValidatingAdmissionPolicy") and no_claim in warning
        kube.wait_pods("users", "train", running(2))
        kube.wait_job("users", "train", phase("Running"))
        shared = condition(kube.job("users", "train"), "CheckpointsShared") or {}
        assert shared.get("reason") == "CheckpointsNotShared", shared
        # the Events of the pods' creation were posted by the reconcile that created them, before the pods ran
        events = kube.core.list_namespaced_event("users", field_selector="involvedObject.kind=PipelineTrainingJob")
        reasons = {e.reason for e in events.items}
        assert not reasons & {"CheckpointsNotShared", "PodsCreated", "Running"}, reasons
        single = cp.kubectl("apply", "-n", "users", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(
            job_manifest("one", pipeline={"stages": 1, "microbatches": 2, "globalBatch": 4})))  # fmt: skip
        assert "Warning" not in single.stderr, single.stderr  # one rank: its own disk is shared enough
        assert "pipefill_operator_" in _get(urls["metrics"])  # the endpoints the Service and the probe use
        _get(urls["liveness"])
    finally:
        operator.stop()
    assert _denied(cp, "pf-pipefill-operator") == []

    out = helm("uninstall", "pf", "-n", RELEASE_NAMESPACE, "--wait", kubeconfig=cp.kubeconfig).stdout
    assert "These resources were kept due to the resource policy" in out
    for name in CRD_NAMES:
        assert cp.kubectl("get", "crd", name, check=False).returncode == 0, f"{name} was deleted"
    for kind, name in [("deployment", "pf-pipefill-operator"), ("serviceaccount", "pf-pipefill-operator")]:
        assert cp.kubectl("get", kind, name, "-n", RELEASE_NAMESPACE, check=False).returncode != 0, (kind, name)
    assert cp.kubectl("get", "clusterrole", "pf-pipefill-operator", check=False).returncode != 0
    job = kube.job("users", "train")
    assert job["status"]["phase"] == "Running" and not job["metadata"].get("finalizers")

    # With no operator left, deleting the job waits on nothing; its children go by garbage collection.
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, "users", PLURAL, "train")
    kube.wait_job_gone("users", "train", timeout_s=30)
    kube.wait_pods("users", "train", lambda pods: not pods, timeout_s=60)

    # Installing the same release again adopts the CRDs it kept; turning crds.install off later leaves them be.
    _install(cp, "install", "pf", CHART, {}, tmp_path)
    uid = json.loads(cp.kubectl("get", "crd", PTJ_CRD, "-o", "json").stdout)["metadata"]["uid"]
    assert uid == upgraded["metadata"]["uid"]
    _install(cp, "upgrade", "pf", CHART, {"crds": {"install": False}}, tmp_path)
    assert json.loads(cp.kubectl("get", "crd", PTJ_CRD, "-o", "json").stdout)["metadata"]["uid"] == uid
    helm("uninstall", "pf", "-n", RELEASE_NAMESPACE, "--wait", kubeconfig=cp.kubeconfig)


def _discovery(cp: ControlPlane, *, namespaced: bool) -> set[tuple[str, str]]:
    """(API group, resource) of every resource the API server serves with that scope."""
    out = cp.kubectl("api-resources", f"--namespaced={str(namespaced).lower()}", "-o", "name").stdout.split()
    return {(name.partition(".")[2], name.partition(".")[0]) for name in out}


@pytest.mark.timeout(300)
def test_a_namespaced_install_runs_the_operators_whole_rbac_scenario_under_its_roles(
    chart_plane: ControlPlane, tmp_path: Path
) -> None:
    cp, kube = chart_plane, Kube(chart_plane)
    _delete_crds(cp)
    _namespaces(cp, RELEASE_NAMESPACE, "team-a", "outside")
    values = {"operator": {"namespaces": ["team-a"], "statusIntervalSeconds": 1}}
    assert "It serves the namespaces team-a." in _install(cp, "install", "scoped", CHART, values, tmp_path)
    manifest = [
        d
        for d in yaml.safe_load_all(
            helm("get", "manifest", "scoped", "-n", RELEASE_NAMESPACE, kubeconfig=cp.kubeconfig).stdout
        )
        if d
    ]

    # The scopes the chart assumes are the API server's.
    cluster_scoped, namespaced = _discovery(cp, namespaced=False), _discovery(cp, namespaced=True)
    for role in by_kind(manifest, "Role"):
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                assert {(group, r.split("/")[0]) for r in rule["resources"]} <= namespaced, rule
    for rule in one(manifest, "ClusterRole")["rules"]:
        for group in rule["apiGroups"]:
            assert {(group, r.split("/")[0]) for r in rule["resources"]} <= cluster_scoped, rule

    account = "scoped-pipefill-operator"
    user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{account}"
    for verb, resource, ns, allowed in [
        ("list", "pods", "team-a", "yes"),
        ("list", "pods", "outside", "no"),
        ("create", "pipelinetrainingjobs.pipefill.io", "team-a", "no"),
        ("list", "nodes", None, "no"),
        ("get", "deviceclasses.resource.k8s.io", None, "yes"),
    ]:
        where = ["-n", ns] if ns else []
        answer = cp.kubectl("auth", "can-i", verb, resource, f"--as={user}", *where, check=False).stdout.strip()
        assert answer == allowed, (verb, resource, ns)

    operator, _ = _operator(cp, "scoped", tmp_path / "operator.log")
    operator.start()
    try:
        _every_kind_of_child(cp, kube, "team-a")
    finally:
        operator.stop()
    assert _denied(cp, account) == []
    helm("uninstall", "scoped", "-n", RELEASE_NAMESPACE, "--wait", kubeconfig=cp.kubeconfig)
    rbac = client.RbacAuthorizationV1Api(kube.api)
    assert [r.metadata.name for r in rbac.list_namespaced_role("team-a").items if r.metadata.name == account] == []


def _every_kind_of_child(cp: ControlPlane, kube: Kube, ns: str) -> None:
    """Jobs that make the operator call every namespaced API its Role grants and the DeviceClass its ClusterRole
    grants: children of every kind (Service, ConfigMap, fill ServiceAccount/Role/RoleBinding, DRA claim template,
    PodGroup, PodDisruptionBudget, pods), Waiting on a ConfigMap, the checkpoint claim, a restart (pods deleted),
    Events, status, and the deletion of a finished job after its TTL."""
    volume = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "hostPath": {"path": f"/tmp/{ns}"}}
    claim = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": ""}
    cp.apply(
        [
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"chart-{ns}"},
             "spec": {**volume, "claimRef": {"namespace": ns, "name": "ckpt"}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ckpt", "namespace": ns},
             "spec": claim},
        ]
    )  # fmt: skip
    pipeline = custom_pipeline("csv")
    kube.create_job(
        ns,
        job_manifest(
            "every", pipeline=pipeline, gpuSharing={"mode": "dra"}, checkpoint={"path": "/ckpt", "claimName": "ckpt"},
            scheduling={"gang": "kubernetes", "podDisruptionBudget": True},
            runPolicy={"ttlSecondsAfterFinished": 0, "terminationGracePeriodSeconds": 5},
        ),
    )  # fmt: skip
    waiting = kube.wait_job(ns, "every", phase("Waiting"))
    assert (condition(waiting, "Waiting") or {}).get("reason") == "ConfigMapMissing"
    kube.create_job(ns, job_manifest("again"))
    pods = kube.wait_pods(ns, "again", running(2))
    kube.end_trainer(ns, pods[0]["metadata"]["name"], 75, "peer gone")  # retryable: a new generation
    kube.wait_pods(ns, "again", running(2, generation=1))
    order = "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"
    cp.apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "csv", "namespace": ns},
               "data": {"schedule.csv": order}}])  # fmt: skip
    for pod in kube.wait_pods(ns, "every", running(2), timeout_s=90):
        kube.end_trainer(ns, pod["metadata"]["name"], 0)
    kube.wait_job_gone(ns, "every")


def test_on_ipv6_the_endpoints_bind_the_pods_ipv6_address(chart_plane: ControlPlane, tmp_path: Path) -> None:
    """ipFamily IPv6: --metrics-address takes the bare address, --liveness a URL with it in brackets."""
    _namespaces(chart_plane, "quiet")
    values = {"operator": {"ipFamily": "IPv6", "namespaces": ["quiet"]}, "crds": {"install": False}}
    args, urls = local_args(one(render(values, tmp_path), "Deployment"), pod_ip="::1")
    operator = DeployedOperator(args, chart_plane.kubeconfig, tmp_path / "operator.log")
    operator.start()
    try:
        assert urls["metrics"].startswith("http://[::1]:") and urls["liveness"].startswith("http://[::1]:")
        assert "pipefill_operator_" in _get(urls["metrics"])
        _get(urls["liveness"])
    finally:
        operator.stop()
