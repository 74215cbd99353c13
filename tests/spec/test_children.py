"""The objects around the rank pods are valid Kubernetes objects, owned by the job, named after it, and carry what
the containers and the gang mechanisms need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pipefill.children import (
    FILL_ACCOUNT,
    FILL_RULES,
    SPEC_ANNOTATION_BUDGET_BYTES,
    Owner,
    desired_children,
    fill_rbac,
    schedule_csv_of,
    spec_config_map,
    spec_document,
    spec_in_config_map,
)
from pipefill.spec import PipelineTrainingJob, load_file, load_training_job, parse, to_obj

ROOT = Path(__file__).resolve().parents[2]
JOBS = {
    m.name: m
    for p in sorted((ROOT / "examples").glob("*.yaml"))
    for m in load_file(p)
    if isinstance(m, PipelineTrainingJob)
}
OWNER = Owner(name="x", uid="0b5c9a8e-1111-2222-3333-444455556666")
CUSTOM = {"schedule": "custom", "customSchedule": {"name": "my-schedule", "key": "order.csv"}}


def _custom_job() -> PipelineTrainingJob:
    obj = to_obj(JOBS["cpu-demo"])
    obj["spec"]["pipeline"].update(CUSTOM)
    obj["metadata"] = {"name": "cpu-demo", "uid": "abc", "resourceVersion": "17", "labels": {"a": "b"}}
    job = parse(obj)
    assert isinstance(job, PipelineTrainingJob)
    return job


def _kinds(objs: list[dict[str, Any]]) -> list[str]:
    return [o["kind"] for o in objs]


@pytest.mark.parametrize("name", sorted(JOBS))
def test_children_are_valid_owned_and_named_after_the_job(name: str) -> None:
    job = JOBS[name]
    children = desired_children(job, namespace="ns", owner=OWNER)
    for obj in children:
        assert obj["metadata"]["namespace"] == "ns"
        assert obj["metadata"]["name"].startswith(job.name)
        assert obj["metadata"]["labels"]["pipefill.io/job-name"] == job.name
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == OWNER.uid and ref["controller"] is True and ref["kind"] == "PipelineTrainingJob"
        if obj["apiVersion"].startswith(("scheduling.volcano.sh", "scheduling.x-k8s.io")):
            continue  # CRDs of other projects: their shape is asserted below
        kubernetes_validate.validate(obj, "1.36", strict=True)
    assert _kinds(children)[0] == "Service"
    assert "ConfigMap" not in _kinds(children), "the spec travels in the pods' annotation (no request of its own)"
    assert not {"ServiceAccount", "Role", "RoleBinding"} & set(_kinds(children)), "the fill identity is the namespace's"
    assert len({(o["kind"], o["metadata"]["name"]) for o in children}) == len(children)


def test_optional_children_follow_the_spec() -> None:
    assert "ResourceClaimTemplate" in _kinds(desired_children(JOBS["gpt-1-3b"], namespace="n"))
    assert "ResourceClaimTemplate" not in _kinds(desired_children(JOBS["cpu-demo"], namespace="n"))
    obj = to_obj(JOBS["cpu-demo"])
    obj["spec"]["scheduling"] = {"podDisruptionBudget": True, "gang": "kubernetes"}
    job = parse(obj)
    assert isinstance(job, PipelineTrainingJob)
    children = {o["kind"]: o for o in desired_children(job, namespace="n")}
    assert children["PodDisruptionBudget"]["spec"]["minAvailable"] == 2
    assert children["PodGroup"]["apiVersion"] == "scheduling.k8s.io/v1alpha2"
    assert children["PodGroup"]["spec"] == {"schedulingPolicy": {"gang": {"minCount": 2}}}


def test_pod_groups_of_volcano_and_coscheduling() -> None:
    volcano = {o["kind"]: o for o in desired_children(JOBS["gang-volcano"], namespace="n")}["PodGroup"]
    assert volcano["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert volcano["spec"] == {"minMember": 4}
    cosched = {o["kind"]: o for o in desired_children(JOBS["gang-coscheduling"], namespace="n")}["PodGroup"]
    assert cosched["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert cosched["spec"] == {"minMember": 4, "scheduleTimeoutSeconds": 600}


def test_dra_claim_template_shares_one_gpu_and_mps_without_limits() -> None:
    template = {o["kind"]: o for o in desired_children(JOBS["gpt-1-3b"], namespace="n")}["ResourceClaimTemplate"]
    claim = template["spec"]["spec"]["devices"]
    assert claim["requests"] == [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]
    (config,) = claim["config"]
    assert config["opaque"]["parameters"]["sharing"] == {"strategy": "MPS"}
    assert "Limit" not in yaml.safe_dump(config)  # caps are per container (the fill's env), never the claim's


def test_fill_role_grants_exactly_what_the_fill_executor_calls() -> None:
    identity = {o["kind"]: o for o in fill_rbac(namespace="n")}
    assert [o["kind"] for o in fill_rbac(namespace="n")] == ["ServiceAccount", "Role", "RoleBinding"]  # Role first
    assert all(
        "ownerReferences" not in o["metadata"] and o["metadata"]["name"] == FILL_ACCOUNT for o in identity.values()
    )
    assert identity["Role"]["rules"] == FILL_RULES
    verbs = {(r, v) for rule in FILL_RULES for r in rule["resources"] for v in rule["verbs"]}
    assert verbs == {
        ("filljobs", "list"),
        ("filljobs", "watch"),
        ("filljobs/status", "get"),
        ("filljobs/status", "patch"),
        ("configmaps", "get"),
    }
    binding = identity["RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FILL_ACCOUNT, "namespace": "n"}]
    assert identity["ServiceAccount"]["automountServiceAccountToken"] is False
    children = {o["kind"]: o for o in desired_children(JOBS["cpu-demo"], namespace="n")}
    service = children["Service"]["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True


def test_spec_config_map_holds_the_defaulted_job_and_the_custom_schedule() -> None:
    job = _custom_job()
    user_map = {"data": {"order.csv": "0F0,0B0\n"}}
    csv = schedule_csv_of(job, user_map)
    cm = spec_config_map(job, namespace="n", schedule_csv=csv)
    assert cm["data"]["order.csv"] == "0F0,0B0\n"
    doc = yaml.safe_load(cm["data"]["job.yaml"])
    assert doc["metadata"] == {"name": "cpu-demo", "labels": {"a": "b"}}  # no uid, no resourceVersion
    assert doc["spec"]["optimizer"]["beta2"] == 0.95  # defaulted
    again = parse(doc)
    assert again.spec == job.spec
    assert spec_document(job) == cm["data"]["job.yaml"]


def test_the_spec_config_map_is_kept_for_a_custom_schedule_and_a_spec_too_large_for_an_annotation() -> None:
    custom = _custom_job()
    assert spec_in_config_map(custom)
    kinds = _kinds(desired_children(custom, namespace="n", schedule_csv="0F0,0B0\n"))
    assert kinds[:2] == ["Service", "ConfigMap"]  # before the pods that mount it
    plain = JOBS["cpu-demo"]
    assert not spec_in_config_map(plain)
    # the pod template's annotations share the budget with the spec (which holds them as well): 70 kB of them
    # take the pair past it
    obj = to_obj(plain)
    many = {f"example.com/a{i}": "x" * 1000 for i in range(70)}
    obj["spec"].setdefault("podTemplate", {})["annotations"] = many
    big = parse(obj)
    assert isinstance(big, PipelineTrainingJob)
    assert 2 * len(many) * 1000 > SPEC_ANNOTATION_BUDGET_BYTES
    assert spec_in_config_map(big)
    assert "ConfigMap" in _kinds(desired_children(big, namespace="n"))
    obj["spec"]["podTemplate"]["annotations"] = dict(list(many.items())[:10])
    some = parse(obj)
    assert isinstance(some, PipelineTrainingJob) and not spec_in_config_map(some)


def test_custom_schedule_lookup_names_the_missing_map_or_key() -> None:
    job = _custom_job()
    assert schedule_csv_of(JOBS["cpu-demo"], None) is None
    with pytest.raises(
        LookupError, match=r"ConfigMap 'my-schedule' \(spec.pipeline.customSchedule.name\) does not exist"
    ):
        schedule_csv_of(job, None)
    with pytest.raises(LookupError, match=r"no key 'order.csv'.*its keys: other"):
        schedule_csv_of(job, {"data": {"other": ""}})
    obj = to_obj(job)
    obj["spec"]["pipeline"]["customSchedule"]["key"] = "job.yaml"
    clash = parse(obj)
    assert isinstance(clash, PipelineTrainingJob)
    with pytest.raises(ValueError, match=r"spec\.pipeline\.customSchedule\.key"):
        spec_config_map(clash, namespace="n", schedule_csv="x")


def test_load_training_job_still_reads_the_examples() -> None:
    assert load_training_job(ROOT / "examples" / "gpu-nodes.yaml").world_size == 8
