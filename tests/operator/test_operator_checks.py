"""What the operator checks and waits for on the real control plane: a spec admission accepts but the operator
refuses (InvalidSpec once, a bounded number of writes), waiting for a custom schedule's ConfigMap, for the ConfigMaps
and claims the pods mount (the model's, the data's) and for a GPU resource no node offers (all clear by themselves),
and status read from the ranks' metrics endpoints."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from operator_harness import Kube, OperatorProcess, condition, job_manifest, operator_requests, phase, running, serving
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from pipefill.devcluster import ControlPlane

pytestmark = pytest.mark.cluster

OPERATOR_USER = "system:serviceaccount:pipefill-system:pipefill-operator"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
SCHEDULE_CSV = "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"


def _status(job: dict[str, Any]) -> dict[str, Any]:
    status: dict[str, Any] = job.get("status") or {}
    return status


def test_a_spec_only_the_operator_refuses_is_invalid_once_with_bounded_writes(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    operator = start_operator()
    # admission accepts it (no CEL rule can sum a list); the layer cut must add up to gpt-tiny's 4 layers
    kube.create_job(
        namespace, job_manifest(pipeline={"stages": 2, "microbatches": 4, "globalBatch": 8, "layersPerStage": [1, 1]})
    )
    job = kube.wait_job(namespace, "train", lambda j: (condition(j, "InvalidSpec") or {}).get("status") == "True")
    invalid = condition(job, "InvalidSpec") or {}
    assert invalid["message"].startswith("spec.pipeline.layersPerStage: Invalid value: [1, 1]: needs every entry")
    assert _status(job)["phase"] == "Failed" and (condition(job, "Failed") or {}).get("reason") == "InvalidSpec"
    # every event on the job makes the operator look again (a reconcile, counted as result "invalid": the spec
    # fails to parse, the loader holds the layer-cut rule), and none of those looks writes anything
    invalid = {"result": "invalid"}
    pokes = 12
    for poke in range(pokes):
        looked = operator.metric("pipefill_operator_reconciles_total", invalid) or 0.0
        kube.patch_job(namespace, "train", {"metadata": {"labels": {"poke": str(poke)}}})
        operator.wait_metric("pipefill_operator_reconciles_total", invalid, lambda n, seen=looked: n > seen)
    writes = [e for e in operator_requests(control_plane, OPERATOR_USER, namespace=namespace) if e["verb"] in WRITES]
    kinds = sorted(
        f"{e['verb']} {e['objectRef']['resource']}{'/' + e['objectRef']['subresource'] if e['objectRef'].get('subresource') else ''}"
        for e in writes
    )
    assert kinds == ["create events", "patch pipelinetrainingjobs/status"], kinds
    assert not kube.core.list_namespaced_pod(namespace).items
    assert (operator.metric("pipefill_operator_reconciles_total", invalid) or 0) >= pokes


def test_waiting_for_the_custom_schedule_configmap_clears_when_it_appears(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    pipeline = {"stages": 2, "microbatches": 4, "globalBatch": 8, "schedule": "custom",
                "customSchedule": {"name": "order", "key": "order.csv"}}  # fmt: skip
    kube.create_job(namespace, job_manifest(pipeline=pipeline))
    job = kube.wait_job(namespace, "train", phase("Waiting"))
    waiting = condition(job, "Waiting") or {}
    assert waiting.get("reason") == "ConfigMapMissing" and "ConfigMap 'order'" in waiting["message"]
    assert not kube.core.list_namespaced_pod(namespace).items
    control_plane.apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "order", "namespace": namespace},
                          "data": {"order.csv": SCHEDULE_CSV}}])  # fmt: skip
    kube.wait_pods(namespace, "train", running(2))
    job = kube.wait_job(namespace, "train", phase("Running"))
    assert (condition(job, "Waiting") or {}).get("status") == "False"
    # a custom schedule keeps the spec ConfigMap: the CSV, copied from the user's, beside the spec (not annotations)
    spec_map = kube.core.read_namespaced_config_map("train-spec", namespace)
    assert spec_map.data["order.csv"] == SCHEDULE_CSV and "job.yaml" in spec_map.data
    pod = kube.core.read_namespaced_pod("train-0", namespace)
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["PIPEFILL_SCHEDULE_FILE"] == "/etc/pipefill/order.csv"
    assert env["PIPEFILL_SPEC_FILE"] == "/etc/pipefill/job.yaml"
    (volume,) = [v for v in pod.spec.volumes if v.name == "spec"]
    assert volume.config_map.name == "train-spec" and volume.downward_api is None
    assert "pipefill.io/spec" not in (pod.metadata.annotations or {})
    # the operator followed that one ConfigMap while the job waited for it, and no other
    follows = [
        e for e in operator_requests(control_plane, OPERATOR_USER, namespace=namespace)
        if e["objectRef"].get("resource") == "configmaps" and e["verb"] in ("list", "watch")
    ]  # fmt: skip
    assert {e["verb"] for e in follows} == {"list", "watch"}
    assert all("fieldSelector=metadata.name%3Dorder" in e["requestURI"] for e in follows), follows


def _follows(control_plane: ControlPlane, namespace: str, resource: str) -> list[dict[str, Any]]:
    """The operator's list and watch requests of ``resource`` in ``namespace``, from the audit log."""
    return [
        e for e in operator_requests(control_plane, OPERATOR_USER, namespace=namespace)
        if e["objectRef"].get("resource") == resource and e["verb"] in ("list", "watch")
    ]  # fmt: skip


def _bound_claim(namespace: str, name: str) -> list[dict[str, Any]]:
    """A ReadWriteMany claim and the volume bound to it (nothing provisions volumes on this control plane)."""
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{name}-{namespace}"},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "hostPath": {"path": "/tmp/x"},
                  "claimRef": {"namespace": namespace, "name": name}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}},
                  "storageClassName": ""}},
    ]  # fmt: skip


def test_a_models_configmap_is_waited_for_until_it_holds_the_config(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    # pods mounting a missing ConfigMap would sit in ContainerCreating without a word on the job
    start_operator()
    model = {"huggingFace": {"path": "/models/llama", "configMap": "llama"}, "seqLen": 64}
    kube.create_job(namespace, job_manifest(model=model))
    job = kube.wait_job(namespace, "train", phase("Waiting"))
    waiting = condition(job, "Waiting") or {}
    assert waiting.get("reason") == "ConfigMapMissing", waiting
    assert waiting["message"].startswith("ConfigMap 'llama' (spec.model.huggingFace.configMap) does not exist")
    (event,) = kube.wait_events(namespace, {"ConfigMapMissing"})  # posted right after the status write
    assert event["message"] == waiting["message"] and event["type"] == "Warning"
    # there, but without config.json: still waiting, now for the key (its watch saw the ConfigMap appear)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "llama", "namespace": namespace},
                  "data": {"README": "the config comes later"}}  # fmt: skip
    control_plane.apply([config_map])
    job = kube.wait_job(
        namespace, "train", lambda j: "has no key" in (condition(j, "Waiting") or {}).get("message", "")
    )
    assert "has no key config.json (its keys: README)" in (condition(job, "Waiting") or {})["message"]
    assert not kube.core.list_namespaced_pod(namespace).items
    config_map["data"]["config.json"] = '{"model_type": "llama"}'
    control_plane.apply([config_map])
    pods = kube.wait_pods(namespace, "train", running(2))
    volumes = {v["name"]: v for v in pods[0]["spec"]["volumes"]}
    assert volumes["model"]["configMap"]["name"] == "llama"
    job = kube.wait_job(namespace, "train", phase("Running"))
    assert (condition(job, "Waiting") or {}).get("status") == "False"
    # the operator followed that one ConfigMap while the job waited for it, and no other
    follows = _follows(control_plane, namespace, "configmaps")
    assert {e["verb"] for e in follows} == {"list", "watch"}
    assert all("fieldSelector=metadata.name%3Dllama" in e["requestURI"] for e in follows), follows


def test_every_missing_object_the_pods_mount_is_named_and_each_is_watched_by_name(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    model = {"python": {"function": "tinymixer:build", "code": {"configMap": "tinymixer-code"}}, "seqLen": 64}
    data = {"source": "text", "path": "/data/corpus.txt", "claimName": "corpus"}
    kube.create_job(namespace, job_manifest(model=model, data=data))
    job = kube.wait_job(namespace, "train", phase("Waiting"))
    waiting = condition(job, "Waiting") or {}
    assert waiting.get("reason") == "ConfigMapMissing", waiting
    assert "ConfigMap 'tinymixer-code' (spec.model.python.code.configMap) does not exist" in waiting["message"]
    assert "PersistentVolumeClaim 'corpus' (spec.data.claimName) does not exist" in waiting["message"]
    control_plane.apply(_bound_claim(namespace, "corpus"))
    job = kube.wait_job(namespace, "train", lambda j: "'corpus'" not in (condition(j, "Waiting") or {})["message"])
    assert (condition(job, "Waiting") or {})["message"].startswith("ConfigMap 'tinymixer-code'")
    assert not kube.core.list_namespaced_pod(namespace).items
    control_plane.apply([{"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "tinymixer-code", "namespace": namespace},
                          "data": {"tinymixer.py": "def build(**kwargs): ...\n"}}])  # fmt: skip
    kube.wait_pods(namespace, "train", running(2))
    job = kube.wait_job(namespace, "train", phase("Running"))
    assert (condition(job, "Waiting") or {}).get("status") == "False"
    for resource, name in (("configmaps", "tinymixer-code"), ("persistentvolumeclaims", "corpus")):
        follows = _follows(control_plane, namespace, resource)
        assert {e["verb"] for e in follows} == {"list", "watch"}, resource
        assert all(f"fieldSelector=metadata.name%3D{name}" in e["requestURI"] for e in follows), follows
    control_plane.kubectl("delete", "pv", f"corpus-{namespace}", "--wait=false")


def test_a_gpu_resource_no_node_offers_is_waited_for_until_a_node_offers_it(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator(clusterwide=True)  # the node watch serves a cluster-wide operator
    resource = f"example.com/{namespace}"
    kube.create_job(
        namespace, job_manifest(resources={"gpus": 1, "gpuResourceName": resource, "cpu": "1", "memory": "1Gi"})
    )
    job = kube.wait_job(namespace, "train", phase("Waiting"))
    assert (condition(job, "Waiting") or {}).get("reason") == "ResourceUnavailable"
    node = "kwok-node-0"
    patch = {"status": {"capacity": {resource: "2"}, "allocatable": {resource: "2"}}}
    kube.core.patch_node_status(node, patch)
    try:
        kube.wait_pods(namespace, "train", lambda pods: len(pods) == 2)
        job = kube.wait_job(namespace, "train", lambda j: _status(j).get("phase") != "Waiting")
        assert (condition(job, "Waiting") or {}).get("status") == "False"
    finally:
        gone = {"status": {"capacity": {resource: None}, "allocatable": {resource: None}}}
        kube.core.patch_node_status(node, gone)


@contextmanager
def _rank_endpoints(pods: list[dict[str, Any]]) -> Iterator[None]:
    """What the ranks would serve: trainer and fill metrics on each pod's IP and named ports (loopback)."""
    servers = []
    for rank, pod in enumerate(sorted(pods, key=lambda p: p["metadata"]["name"])):
        ports = {p["name"]: p["containerPort"] for c in (*pod["spec"]["containers"], *pod["spec"]["initContainers"])
                 for p in c.get("ports", [])}  # fmt: skip
        trainer, fill = CollectorRegistry(), CollectorRegistry()
        Gauge("pipefill_trainer_step", "", registry=trainer).set(30 + rank)
        Gauge("pipefill_trainer_loss", "", registry=trainer).set(2.5)
        Histogram("pipefill_trainer_step_seconds", "", registry=trainer).observe(10.0)
        Counter("pipefill_trainer_bubble_seconds_total", "", ["kind"], registry=trainer).labels("steady").inc(
            2 + 2 * rank
        )
        Gauge("pipefill_fill_bubble_recovery_ratio", "", registry=fill).set(0.5 + 0.2 * rank)
        ip = pod["status"]["podIP"]
        servers.append(start_http_server(ports["trainer-metrics"], addr=ip, registry=trainer))
        servers.append(start_http_server(ports["fill-metrics"], addr=ip, registry=fill))
    with serving(servers):
        yield


def test_status_comes_from_the_ranks_metrics_endpoints(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    operator = start_operator(status_interval_s=1.0)
    kube.create_job(namespace, job_manifest(steps=120))
    pods = kube.wait_pods(namespace, "train", running(2))
    assert all(p["status"]["podIP"].startswith("127.") for p in pods)  # loopback only
    kube.wait_job(namespace, "train", phase("Running"))
    with _rank_endpoints(pods):
        job = kube.wait_job(namespace, "train", lambda j: _status(j).get("currentStep") == 30)
    status = _status(job)
    assert status["bubbleFraction"] == pytest.approx((0.2 + 0.4) / 2)
    assert status["fillUtilization"] == pytest.approx(0.6)
    # progress against spec.steps, the loss, and when the last step ends at 10 s a step (90 steps to go)
    assert (status["progress"], status["loss"]) == (25.0, 2.5)
    eta = datetime.datetime.fromisoformat(status["estimatedCompletionTime"].replace("Z", "+00:00"))
    left_s = (eta - datetime.datetime.now(datetime.UTC)).total_seconds()
    assert 900 - 60 <= left_s <= 900 + 5, status["estimatedCompletionTime"]
    printed = control_plane.kubectl("get", "ptj", "train", "-n", namespace).stdout.splitlines()[1].split()
    assert printed[:6] == ["train", "Running", "30", "120", "25", "2.5"]
    assert (operator.metric("pipefill_operator_status_reads_total", {"result": "ok"}) or 0) >= 4
    assert json.dumps(status)  # the status stays what the CRD's schema allows (the API server accepted it)


def test_a_missing_checkpoint_claim_is_waited_for_and_a_shared_one_is_recorded(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    kube.create_job(namespace, job_manifest(checkpoint={"path": "/ckpt", "claimName": "ckpt"}))
    job = kube.wait_job(namespace, "train", phase("Waiting"))
    assert (condition(job, "Waiting") or {}).get("reason") == "CheckpointClaimMissing"
    assert not kube.core.list_namespaced_pod(namespace).items
    control_plane.apply(
        [
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"ckpt-{namespace}"},
             "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "hostPath": {"path": "/tmp/x"},
                      "claimRef": {"namespace": namespace, "name": "ckpt"}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ckpt", "namespace": namespace},
             "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}},
                      "storageClassName": ""}},
        ]
    )  # fmt: skip
    kube.wait_pods(namespace, "train", running(2))
    job = kube.wait_job(namespace, "train", phase("Running"))
    assert (condition(job, "CheckpointsShared") or {}).get("reason") == "SharedVolume"
    control_plane.kubectl("delete", "pv", f"ckpt-{namespace}", "--wait=false")
