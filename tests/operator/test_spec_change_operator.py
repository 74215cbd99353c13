"""An allowed edit of a running job, through the operator on the real control plane: the running pods keep their
spec, and SpecChangePending and its Event name the fields that wait for the next gang (read from the pods' spec
annotation, or from the spec ConfigMap that a custom schedule's pods mount) and those taken at once; an immutable
field's edit is refused by the API server, naming the field, and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from operator_harness import Kube, OperatorProcess, condition, job_manifest, phase, running

from pipefill.devcluster import ControlPlane

pytestmark = pytest.mark.cluster

SCHEDULE_CSV = "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"
EDIT = {"spec": {"steps": 200, "optimizer": {"learningRate": 0.001}, "runPolicy": {"backoffLimit": 5}}}
NAMED = "spec.optimizer.learningRate, spec.steps changed: spec generation 2 is not in the running pods"


def _pending(job: dict[str, Any]) -> str | None:
    found = condition(job, "SpecChangePending") or {}
    return str(found["message"]) if found.get("status") == "True" else None


def _edit_and_expect_the_notice(kube: Kube, namespace: str) -> None:
    before = {p["metadata"]["uid"] for p in kube.wait_pods(namespace, "train", running(2))}
    kube.wait_job(namespace, "train", phase("Running"))
    kube.patch_job(namespace, "train", EDIT)
    job = kube.wait_job(namespace, "train", lambda j: _pending(j) is not None)
    message = _pending(job)
    assert message is not None and message.startswith(NAMED), message
    assert message.endswith("; taken at once: spec.runPolicy.backoffLimit"), message
    (event,) = kube.wait_events(namespace, {"SpecChangePending"})
    assert event["message"] == message and event["type"] == "Normal"
    now = {p["metadata"]["uid"] for p in kube.wait_pods(namespace, "train", running(2))}
    assert now == before  # the running gang is kept: the edit waits for the next one


def test_an_edit_names_its_fields_read_from_the_pods_annotation(
    kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    kube.create_job(namespace, job_manifest())
    _edit_and_expect_the_notice(kube, namespace)


def test_an_edit_names_its_fields_read_from_the_spec_configmap(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    control_plane.apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "order", "namespace": namespace},
                          "data": {"order.csv": SCHEDULE_CSV}}])  # fmt: skip
    pipeline = {"stages": 2, "microbatches": 4, "globalBatch": 8, "schedule": "custom",
                "customSchedule": {"name": "order", "key": "order.csv"}}  # fmt: skip
    kube.create_job(namespace, job_manifest(pipeline=pipeline))
    _edit_and_expect_the_notice(kube, namespace)


def test_an_immutable_field_is_refused_naming_it_and_nothing_changes(
    kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    kube.create_job(namespace, job_manifest())
    kube.wait_job(namespace, "train", phase("Running"))
    with pytest.raises(ApiException) as refused:
        kube.patch_job(namespace, "train", {"spec": {"pipeline": {"stages": 1}}})
    causes = json.loads(refused.value.body)["details"]["causes"]
    assert [c["field"] for c in causes] == ["spec.pipeline.stages"]
    assert "spec.pipeline.stages is immutable" in causes[0]["message"]
    assert "delete the job and create it again" in causes[0]["message"]
    job = kube.wait_job(namespace, "train", phase("Running"))
    assert job["metadata"]["generation"] == 1 and _pending(job) is None
