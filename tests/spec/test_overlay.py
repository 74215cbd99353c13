"""spec.podTemplate is merged into every rank pod, and every collision with what the operator sets is refused with
the field named; the CRD's own rules refuse malformed overlays at admission."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from pipefill.children import SPEC_ANNOTATION
from pipefill.overlay import OverlayError
from pipefill.pods import rank_pod
from pipefill.spec import PipelineTrainingJob, SpecError, load_training_job, parse, to_obj

ROOT = Path(__file__).resolve().parents[2]


def _with_template(template: dict[str, Any], *, fill: bool = True) -> PipelineTrainingJob:
    obj = to_obj(load_training_job(ROOT / "examples" / "cpu-demo.yaml"))
    obj["spec"]["podTemplate"] = template
    obj["spec"]["fill"]["enabled"] = fill
    job = parse(obj)
    assert isinstance(job, PipelineTrainingJob)
    return job


def test_gpu_node_overlay_reaches_the_pod() -> None:
    pod = rank_pod(load_training_job(ROOT / "examples" / "gpu-nodes.yaml"), 3)
    spec = pod["spec"]
    assert pod["metadata"]["labels"]["team"] == "research"
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert {"name": "infiniband", "hostPath": {"path": "/dev/infiniband"}} in spec["volumes"]
    trainer = spec["containers"][0]
    env = {e["name"]: e for e in trainer["env"]}
    assert env["NCCL_IB_HCA"]["value"] == "mlx5"
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": False}}
    assert {"name": "infiniband", "mountPath": "/dev/infiniband", "readOnly": False} in trainer["volumeMounts"]
    assert trainer["resources"]["limits"] == {"nvidia.com/gpu": "1", "rdma/rdma_shared_device_a": "1"}
    fill = spec["initContainers"][0]
    assert "NCCL_IB_HCA" not in {e["name"] for e in fill["env"]}  # per container: the trainer's only
    kubernetes_validate.validate(pod, "1.36", strict=True)


def test_host_aliases_resolve_rank_0_where_no_cluster_dns_answers() -> None:
    """A hostNetwork job on a cluster without DNS (the dev cluster's real node) names rank 0's node for MASTER_ADDR."""
    aliases = [{"ip": "127.0.1.10", "hostnames": ["cpu-demo-0.cpu-demo"]}]
    job = _with_template({"hostNetwork": True, "hostAliases": aliases})
    for rank in range(job.world_size):
        pod = rank_pod(job, rank)
        assert pod["spec"]["hostAliases"] == aliases
        trainer = pod["spec"]["containers"][0]
        master = next(e["value"] for e in trainer["env"] if e["name"] == "MASTER_ADDR")
        assert master in aliases[0]["hostnames"]
        kubernetes_validate.validate(pod, "1.36", strict=True)
    assert "hostAliases" not in rank_pod(_with_template({}), 0)["spec"]


def test_fill_overlay_env_from_and_affinity() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
            }
        }
    }
    job = _with_template(
        {
            "affinity": affinity,
            "annotations": {"example.com/owner": "ml"},
            "fill": {"envFrom": [{"secretRef": {"name": "s3"}, "prefix": "S3_"}]},
        }
    )
    pod = rank_pod(job, 0)
    assert pod["spec"]["affinity"] == affinity
    assert pod["metadata"]["annotations"]["example.com/owner"] == "ml"
    assert set(pod["metadata"]["annotations"]) == {"example.com/owner", SPEC_ANNOTATION}  # and the job's spec
    assert pod["spec"]["initContainers"][0]["envFrom"] == [
        {"secretRef": {"name": "s3", "optional": False}, "prefix": "S3_"}
    ]
    assert "envFrom" not in pod["spec"]["containers"][0]
    kubernetes_validate.validate(pod, "1.36", strict=True)


@pytest.mark.parametrize(
    ("template", "field", "fill"),
    [
        ({"labels": {"pipefill.io/rank": "7"}}, "spec.podTemplate.labels['pipefill.io/rank']", True),
        ({"labels": {"app.kubernetes.io/name": "x"}}, "spec.podTemplate.labels['app.kubernetes.io/name']", True),
        ({"trainer": {"env": [{"name": "RANK", "value": "0"}]}}, "spec.podTemplate.trainer.env[0].name", True),
        ({"fill": {"env": [{"name": "PIPEFILL_DEVICE", "value": "cuda"}]}}, "spec.podTemplate.fill.env[0].name", True),
        ({"volumes": [{"name": "channel", "emptyDir": {}}]}, "spec.podTemplate.volumes[0].name", True),
        (
            {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "trainer": {"volumeMounts": [{"name": "x", "mountPath": "/tmp"}]},
            },
            "spec.podTemplate.trainer.volumeMounts[0].mountPath",
            True,
        ),
        (
            {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "trainer": {"volumeMounts": [{"name": "x", "mountPath": "/workspace"}]},
            },
            "spec.podTemplate.trainer.volumeMounts[0].mountPath",
            True,
        ),
        (
            {"trainer": {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}},
            "spec.podTemplate.trainer.volumeMounts[0].name",
            True,
        ),
        (
            {"trainer": {"resources": {"requests": {"cpu": "2"}}}},
            "spec.podTemplate.trainer.resources.requests['cpu']",
            True,
        ),
        ({"fill": {"env": [{"name": "A", "value": "1"}]}}, "spec.podTemplate.fill", False),
    ],
)
def test_collisions_with_the_operators_pod_are_refused(template: dict[str, Any], field: str, fill: bool) -> None:
    job = _with_template(template, fill=fill)
    with pytest.raises(OverlayError) as caught:
        rank_pod(job, 0)
    assert [e.path for e in caught.value.errors] == [field]
    assert field in str(caught.value)


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ({"volumes": [{"name": "x"}]}, "exactly one source"),
        ({"volumes": [{"name": "x", "emptyDir": {}, "secret": {"secretName": "s"}}]}, "exactly one source"),
        ({"tolerations": [{"operator": "Exists", "key": "k", "value": "v"}]}, "takes no value"),
        ({"tolerations": [{"value": "v"}]}, "without key must use operator Exists"),
        ({"tolerations": [{"key": "k", "tolerationSeconds": 5}]}, "NoExecute only"),
        (
            {
                "trainer": {
                    "env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
                }
            },
            "not both",
        ),
        ({"trainer": {"envFrom": [{"prefix": "P"}]}}, "exactly one of secretRef and configMapRef"),
        ({"security": {"runAsUser": 0}}, "spec.podTemplate.security.runAsUser"),
        ({"trainer": {"resources": {"limits": {"rdma/hca": "lots"}}}}, "quantity"),
    ],
)
def test_admission_refuses_malformed_overlays(template: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        _with_template(template)
