"""The operator as its own process on the real control plane (kwok GPU nodes; the test plays the kubelet by patching
pod status): children, the gang's restarts and failures, suspend, deadline, TTL, deletion, disruptions."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kubernetes import client
from operator_harness import Kube, OperatorProcess, condition, job_manifest, operator_requests, phase, running
from waiting import wait_for

from pipefill import env
from pipefill.children import SPEC_ANNOTATION, spec_document
from pipefill.devcluster import ControlPlane
from pipefill.pods import SPEC_GENERATION_LABEL, SPEC_MOUNT
from pipefill.spec import PipelineTrainingJob, parse

pytestmark = pytest.mark.cluster

OPERATOR_USER = "system:serviceaccount:pipefill-system:pipefill-operator"
CHILD_KINDS = ("service", "poddisruptionbudget")  # no spec ConfigMap: the spec travels in the pods' annotation
IDENTITY_KINDS = ("serviceaccount", "role", "rolebinding")  # the namespace's fill identity, owned by no job


def _get(cp: ControlPlane, namespace: str, *what: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cp.kubectl("get", "-n", namespace, *what, "-o", "json").stdout)
    return out


def _status(job: dict[str, Any]) -> dict[str, Any]:
    status: dict[str, Any] = job.get("status") or {}
    return status


def _recording(seen: list[str], done: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    """A predicate that also records every phase the watch shows (transient ones included)."""

    def check(job: dict[str, Any]) -> bool:
        value = _status(job).get("phase")
        if value and (not seen or seen[-1] != value):
            seen.append(value)
        return done(job)

    return check


def _pod_creates(cp: ControlPlane, namespace: str) -> list[str]:
    return [
        e["objectRef"].get("name", "")
        for e in operator_requests(cp, OPERATOR_USER, namespace=namespace)
        if e["verb"] == "create" and e["objectRef"].get("resource") == "pods" and not e["objectRef"].get("subresource")
    ]


def test_create_makes_every_child_owned_and_the_gang_runs_on_gpu_nodes(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    made = kube.create_job(namespace, job_manifest(scheduling={"podDisruptionBudget": True}))
    uid = made["metadata"]["uid"]
    pods = kube.wait_pods(namespace, "train", running(2))
    job = kube.wait_job(namespace, "train", phase("Running"))
    for kind in CHILD_KINDS:
        items = _get(control_plane, namespace, kind, "-l", "pipefill.io/job-name=train")["items"]
        assert len(items) == 1, kind
        (ref,) = items[0]["metadata"]["ownerReferences"]
        assert (ref["uid"], ref["kind"], ref["controller"]) == (uid, "PipelineTrainingJob", True), kind
    for kind in IDENTITY_KINDS:
        (item,) = _get(control_plane, namespace, kind, "-l", "app.kubernetes.io/managed-by=pipefill-operator")["items"]
        assert item["metadata"]["name"] == "pipefill-fill" and not item["metadata"].get("ownerReferences"), kind
    tainted = f"kwok-node-{control_plane.nodes - 1}"
    for pod in pods:
        assert pod["metadata"]["ownerReferences"][0]["uid"] == uid
        assert pod["spec"]["nodeName"].startswith("kwok-node-") and pod["spec"]["nodeName"] != tainted
        assert pod["status"]["podIP"].startswith("127.")
    status = _status(job)
    assert (status["ranksReady"], status["generation"], status["restarts"], status["observedGeneration"]) == (
        2,
        0,
        0,
        1,
    )
    assert status["startTime"] and (condition(job, "Created") or {}).get("status") == "True"
    assert "finalizers" not in job["metadata"]
    kube.wait_events(namespace, {"CheckpointsNotShared"})


def test_each_rank_pod_carries_its_jobs_spec_for_the_trainer_at_no_request_of_its_own(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    """The trainer reads PIPEFILL_SPEC_FILE; on the cluster that file is the pod's own spec annotation, written by
    the kubelet from the downward API volume the API server stored. kwok runs no container, so this checks the pods
    as stored: the file's path is the volume's item under the trainer's mount, and the annotation is the job's spec
    (the server's defaults and the job's own labels included). No ConfigMap carries it, and none was created."""
    start_operator()
    manifest = job_manifest(steps=123, podTemplate={"annotations": {"example.com/team": "ml"}})
    manifest["metadata"]["labels"] = {"example.com/project": "p1"}
    kube.create_job(namespace, manifest)
    pods = kube.wait_pods(namespace, "train", running(2))
    body = kube.job(namespace, "train")
    job = parse({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec")})
    assert isinstance(job, PipelineTrainingJob)
    for pod in pods:
        document = pod["metadata"]["annotations"][SPEC_ANNOTATION]
        assert document == spec_document(job)
        seen = parse(yaml.safe_load(document))
        assert isinstance(seen, PipelineTrainingJob)
        assert seen.spec == job.spec and seen.spec.steps == 123
        assert seen.metadata["labels"] == {"example.com/project": "p1"}
        assert pod["metadata"]["annotations"]["example.com/team"] == "ml"
        (trainer,) = pod["spec"]["containers"]
        variables = {e["name"]: e.get("value") for e in trainer["env"]}
        (mount,) = [m for m in trainer["volumeMounts"] if m["mountPath"] == SPEC_MOUNT]
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
        (item,) = volume["downwardAPI"]["items"]
        assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{SPEC_ANNOTATION}']"
        assert variables[env.SPEC_FILE] == f"{mount['mountPath']}/{item['path']}"
    assert not _get(control_plane, namespace, "configmap", "-l", "pipefill.io/job-name=train")["items"]
    made = [
        e["objectRef"].get("resource")
        for e in operator_requests(control_plane, OPERATOR_USER, namespace=namespace)
        if e["verb"] == "create"
    ]
    assert "configmaps" not in made and made.count("pods") == 2, made
    # an edit while the gang runs is not taken silently: the pods keep their spec, the job says the edit waits
    assert {p["metadata"]["labels"][SPEC_GENERATION_LABEL] for p in pods} == {"1"}
    kube.patch_job(namespace, "train", {"spec": {"steps": 200}})
    job_now = kube.wait_job(
        namespace, "train", lambda j: (condition(j, "SpecChangePending") or {}).get("status") == "True"
    )
    assert "spec generation 2" in condition(job_now, "SpecChangePending")["message"]  # type: ignore[index]
    kube.wait_events(namespace, {"SpecChangePending"})
    now = kube.wait_pods(namespace, "train", running(2))
    after = {p["metadata"]["uid"]: p["metadata"]["annotations"][SPEC_ANNOTATION] for p in now}
    assert after == {p["metadata"]["uid"]: p["metadata"]["annotations"][SPEC_ANNOTATION] for p in pods}


def test_the_tainted_gpu_node_takes_only_pods_that_tolerate_it(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    tainted = f"kwok-node-{control_plane.nodes - 1}"
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    pinned = {"nodeSelector": {"kubernetes.io/hostname": tainted}}
    kube.create_job(namespace, job_manifest("tolerates", podTemplate={**pinned, "tolerations": [toleration]}))
    kube.create_job(namespace, job_manifest("intolerant", podTemplate=pinned))
    pods = kube.wait_pods(namespace, "tolerates", running(2))
    assert {p["spec"]["nodeName"] for p in pods} == {tainted}

    def unschedulable(pods: list[dict[str, Any]]) -> bool:
        return len(pods) == 2 and all(
            any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in p["status"].get("conditions", [])
            )
            for p in pods
        )

    pods = kube.wait_pods(namespace, "intolerant", unschedulable)
    assert not any(p["spec"].get("nodeName") for p in pods)
    assert _status(kube.job(namespace, "intolerant"))["phase"] == "Pending"


def test_a_retryable_trainer_exit_restarts_the_whole_gang_once(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    pods, _ = _running_job(kube, namespace)
    seen: list[str] = []
    before = kube.job(namespace, "train")  # every status after it is watched, however fast the restart goes
    kube.end_trainer(namespace, "train-1", 75, "rendezvous with rank 0 timed out")
    job = kube.wait_job(
        namespace,
        "train",
        _recording(seen, lambda j: _status(j).get("generation") == 1 and _status(j)["phase"] == "Running"),
        since=before,
    )
    assert seen[0] == "Running" and "Restarting" in seen, seen  # a CI run saw only ['Running']: its list came after
    assert (_status(job)["restarts"], _status(job)["disruptions"]) == (1, 0)
    new = kube.wait_pods(namespace, "train", running(2, generation=1))
    assert {p["metadata"]["uid"] for p in new}.isdisjoint({p["metadata"]["uid"] for p in pods})
    assert sorted(_pod_creates(control_plane, namespace)) == ["train-0", "train-0", "train-1", "train-1"]
    (restart,) = kube.wait_events(namespace, {"TrainerFailed"})
    assert "rank 1 (pod train-1): trainer exited with code 75: rendezvous with rank 0 timed out" in restart["message"]


def _hold_pod_creation(cp: ControlPlane, namespace: str) -> None:
    """A ValidatingAdmissionPolicy that forbids creating pods in ``namespace``; returns once the API server applies
    it (checked with a server-side dry-run, the only way to see an admission policy in force)."""
    cp.apply(
        [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": f"hold-{namespace}"},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {
                        "resourceRules": [
                            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                        ]
                    },
                    "validations": [{"expression": "false", "message": "held by the test", "reason": "Forbidden"}],
                },
            },
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": f"hold-{namespace}"},
                "spec": {
                    "policyName": f"hold-{namespace}",
                    "validationActions": ["Deny"],
                    "matchResources": {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                    },
                },
            },
        ]
    )
    _wait_creation_allowed(cp, namespace, allowed=False)


def _job_pods(kube: Kube, namespace: str, **spec: Any) -> list[dict[str, Any]]:
    """Job "train" (``job_manifest(**spec)``) created: its 2 pods, once Running."""
    kube.create_job(namespace, job_manifest(**spec))
    return kube.wait_pods(namespace, "train", running(2))


def _running_job(kube: Kube, namespace: str, **spec: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Job "train" (``job_manifest(**spec)``) created, once its 2 pods and then the job are Running: pods, job."""
    pods = _job_pods(kube, namespace, **spec)
    return pods, kube.wait_job(namespace, "train", phase("Running"))


def _wait_creation_allowed(cp: ControlPlane, namespace: str, *, allowed: bool, timeout_s: float = 30) -> None:
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": namespace},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip

    def dry_run() -> Any:  # one dry-run request each try: the policy informer has no event to wait on
        return cp.kubectl("create", "--dry-run=server", "-f", "-", check=False, stdin=json.dumps(probe))

    what = f"pod creation in {namespace} {'allowed' if allowed else 'held'}"
    wait_for(dry_run, what, timeout_s, interval_s=0.2, until=lambda done: (done.returncode == 0) == allowed)


def test_an_operator_killed_between_deleting_the_old_gang_and_creating_the_new_one_restarts_it_once(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    operator = start_operator()
    _running_job(kube, namespace)
    _hold_pod_creation(control_plane, namespace)  # the new gang cannot be created: the operator is caught between
    kube.end_trainer(namespace, "train-0", 143)
    kube.wait_pods(namespace, "train", lambda pods: not pods)
    job = kube.wait_job(namespace, "train", lambda j: _status(j).get("generation") == 1)
    assert (_status(job)["phase"], _status(job)["restarts"]) == ("Restarting", 1)
    operator.kill()
    control_plane.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", f"hold-{namespace}")
    _wait_creation_allowed(control_plane, namespace, allowed=True)
    start_operator()
    job = kube.wait_job(namespace, "train", lambda j: _status(j).get("phase") == "Running")
    assert (_status(job)["restarts"], _status(job)["generation"]) == (1, 1)
    kube.wait_pods(namespace, "train", running(2, generation=1))
    created = [e["objectRef"]["name"] for e in operator_requests(control_plane, OPERATOR_USER, namespace=namespace)
               if e["verb"] == "create" and e["objectRef"].get("resource") == "pods"
               and e["responseStatus"]["code"] == 201]  # fmt: skip
    assert sorted(created) == ["train-0", "train-0", "train-1", "train-1"]  # generation 0, then exactly one more


def test_an_exhausted_backoff_limit_fails_the_job_with_the_reason(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    _job_pods(kube, namespace, runPolicy={"backoffLimit": 1, "terminationGracePeriodSeconds": 5})
    kube.end_trainer(namespace, "train-0", 75)
    kube.wait_pods(namespace, "train", running(2, generation=1))
    kube.end_trainer(namespace, "train-1", 137, "killed")
    job = kube.wait_job(namespace, "train", phase("Failed"))
    failed = condition(job, "Failed") or {}
    assert failed.get("reason") == "BackoffLimitExceeded"
    assert "rank 1 (pod train-1): trainer exited with code 137 (SIGKILL): killed" in failed["message"]
    assert _status(job)["restarts"] == 1 and _status(job)["completionTime"]
    pods = kube.wait_pods(namespace, "train", lambda pods: [p["metadata"]["name"] for p in pods] == ["train-1"])
    assert pods[0]["status"]["phase"] == "Failed"  # kept for inspection; the live rank was stopped


def test_a_permanent_exit_fails_the_job_whatever_its_peer_exits_with(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    operator = start_operator()
    _running_job(kube, namespace)
    operator.stop()  # both exits are seen at once: no order to race on
    kube.end_trainer(namespace, "train-0", 75)
    kube.end_trainer(namespace, "train-1", 1, "ValueError: bad batch")
    start_operator()
    job = kube.wait_job(namespace, "train", phase("Failed"))
    failed = condition(job, "Failed") or {}
    assert (
        failed.get("reason") == "TrainerFailed"
        and "rank 1 (pod train-1): trainer exited with code 1" in failed["message"]
    )
    assert _status(job)["restarts"] == 0 and _status(job)["generation"] == 0


def test_fill_sidecar_restarts_are_reported_and_the_job_keeps_running(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    _job_pods(kube, namespace)
    kube.restart_fill(namespace, "train-1", 2)
    job = kube.wait_job(namespace, "train", lambda j: _status(j).get("fillRestarts") == 2)
    assert _status(job)["phase"] == "Running" and _status(job)["restarts"] == 0
    (event,) = kube.wait_events(namespace, {"FillExecutorRestarted"})
    assert "rank 1: 2" in event["message"] and event["type"] == "Warning"


def test_suspend_deletes_the_pods_and_resume_starts_a_new_generation(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    _job_pods(kube, namespace)
    kube.patch_job(namespace, "train", {"spec": {"runPolicy": {"suspend": True}}})
    kube.wait_pods(namespace, "train", lambda pods: not pods)
    job = kube.wait_job(namespace, "train", phase("Suspended"))
    assert (condition(job, "Suspended") or {}).get("status") == "True"
    kube.patch_job(namespace, "train", {"spec": {"runPolicy": {"suspend": False}}})
    kube.wait_pods(namespace, "train", running(2, generation=1))
    job = kube.wait_job(namespace, "train", phase("Running"))
    assert (_status(job)["restarts"], _status(job)["generation"]) == (0, 1)
    assert (condition(job, "Suspended") or {}).get("reason") == "Resumed"


def test_active_deadline_fails_the_job_and_stops_its_pods(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    _job_pods(kube, namespace, runPolicy={"activeDeadlineSeconds": 3, "terminationGracePeriodSeconds": 5})
    job = kube.wait_job(namespace, "train", phase("Failed"), timeout_s=30)
    assert (condition(job, "Failed") or {}).get("reason") == "DeadlineExceeded"
    kube.wait_pods(namespace, "train", lambda pods: not pods)


def test_a_finished_job_is_deleted_after_its_ttl_with_everything_it_owned(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    kube.create_job(
        namespace, job_manifest(runPolicy={"ttlSecondsAfterFinished": 1, "terminationGracePeriodSeconds": 5})
    )
    kube.wait_pods(namespace, "train", running(2))
    seen: list[str] = []
    before = kube.wait_job(namespace, "train", _recording(seen, phase("Running")))
    for pod in ("train-0", "train-1"):
        kube.end_trainer(namespace, pod, 0)
    # from the version before the trainers ended: Succeeded is seen even where the TTL deleted the job first
    kube.wait_job(namespace, "train", _recording(seen, phase("Succeeded")), since=before)
    kube.wait_job_gone(namespace, "train")
    assert seen[-1] == "Succeeded"
    for kind in ("pods", *CHILD_KINDS[:-1]):
        kube.wait_gone(
            _lister(kube, kind), namespace, f"{kind} of the job", label_selector="pipefill.io/job-name=train"
        )


def _lister(kube: Kube, kind: str) -> Callable[..., Any]:
    rbac = client.RbacAuthorizationV1Api(kube.api)
    return {
        "pods": kube.core.list_namespaced_pod,
        "service": kube.core.list_namespaced_service,
        "configmap": kube.core.list_namespaced_config_map,
        "serviceaccount": kube.core.list_namespaced_service_account,
        "role": rbac.list_namespaced_role,
        "rolebinding": rbac.list_namespaced_role_binding,
    }[kind]


def test_deleting_the_job_leaves_nothing_behind_and_never_waits_on_a_finalizer(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    _, job = _running_job(kube, namespace)
    assert not job["metadata"].get("finalizers")
    control_plane.kubectl("delete", "ptj", "train", "-n", namespace, "--wait=true", "--timeout=20s")
    for kind in ("pods", *CHILD_KINDS[:-1]):
        kube.wait_gone(
            _lister(kube, kind), namespace, f"{kind} of the job", label_selector="pipefill.io/job-name=train"
        )


def test_an_evicted_rank_restarts_the_gang_without_counting_against_the_backoff_limit(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    _running_job(kube, namespace, runPolicy={"backoffLimit": 0, "terminationGracePeriodSeconds": 5})
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "train-0", "namespace": namespace}}
    kube.core.create_namespaced_pod_eviction("train-0", namespace, eviction)
    job = kube.wait_job(
        namespace, "train", lambda j: _status(j).get("generation") == 1 and _status(j)["phase"] == "Running"
    )
    assert (_status(job)["restarts"], _status(job)["disruptions"]) == (0, 1)
    assert (condition(job, "Restarting") or {}).get("status") == "False"
    (event,) = kube.wait_events(namespace, {"Disrupted"})
    assert "not counted against backoffLimit" in event["message"]
