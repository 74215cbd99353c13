"""Our objects on the real API server: printer columns and short names, the status subresource, rank pods of every
GPU-sharing mode (server-side dry-run), and a DRA claim allocated by the real scheduler on a kwok GPU node."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipefill.children import fill_rbac
from pipefill.devcluster import ControlPlane
from pipefill.pods import rank_pod
from pipefill.spec import PipelineTrainingJob, load_file, parse, to_obj

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
GPU_JOB = next(m for m in load_file(ROOT / "examples" / "gpu-interleaved.yaml") if isinstance(m, PipelineTrainingJob))
FILL_JOB = yaml.safe_load((ROOT / "examples" / "fill-inference.yaml").read_text())


def _apply(cp: ControlPlane, namespace: str, obj: dict[str, Any]) -> None:
    cp.kubectl("apply", "-n", namespace, "--validate=strict", "-f", "-", stdin=yaml.safe_dump(obj))


def _get(cp: ControlPlane, namespace: str, *what: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cp.kubectl("get", "-n", namespace, *what, "-o", "json").stdout)
    return out


def test_printer_columns_and_short_names(control_plane: ControlPlane, namespace: str) -> None:
    _apply(control_plane, namespace, to_obj(GPU_JOB))
    _apply(control_plane, namespace, FILL_JOB)
    ptj = control_plane.kubectl("get", "ptj", "-n", namespace).stdout.splitlines()
    fj = control_plane.kubectl("get", "fj", "-n", namespace).stdout.splitlines()
    crd = _get(control_plane, "default", "crd", "pipelinetrainingjobs.pipefill.io")
    columns = [c["name"].upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert ptj[0].split() == ["NAME", *columns]
    assert ptj[1].split()[0] == GPU_JOB.name
    assert fj[0].split()[0] == "NAME" and fj[1].split()[0] == FILL_JOB["metadata"]["name"]
    both = control_plane.kubectl("get", "ptj,fj", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(both) == sorted(
        [f"pipelinetrainingjob.pipefill.io/{GPU_JOB.name}", f"filljob.pipefill.io/{FILL_JOB['metadata']['name']}"]
    )


def test_spec_change_bumps_generation_status_patch_does_not(control_plane: ControlPlane, namespace: str) -> None:
    _apply(control_plane, namespace, to_obj(GPU_JOB))
    before = _get(control_plane, namespace, "ptj", GPU_JOB.name)["metadata"]["generation"]
    control_plane.kubectl(
        "patch", "ptj", GPU_JOB.name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Running"}}),
    )  # fmt: skip
    after_status = _get(control_plane, namespace, "ptj", GPU_JOB.name)
    assert after_status["metadata"]["generation"] == before
    assert after_status["status"]["phase"] == "Running"
    # a status written through the main resource is dropped: status belongs to the subresource
    control_plane.kubectl(
        "patch", "ptj", GPU_JOB.name, "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"steps": 7}, "status": {"phase": "Failed"}}),
    )  # fmt: skip
    after_spec = _get(control_plane, namespace, "ptj", GPU_JOB.name)
    assert after_spec["metadata"]["generation"] == before + 1
    assert after_spec["status"]["phase"] == "Running"


def _sharing_variants() -> list[tuple[str, PipelineTrainingJob]]:
    variants = []
    for mode, gpus, mps in [
        ("dra", 1, True),
        ("dra", 1, False),
        ("visibleDevices", 1, True),
        ("none", 1, False),
        ("none", 0, False),
    ]:
        obj = copy.deepcopy(to_obj(GPU_JOB))
        obj["spec"]["resources"]["gpus"] = gpus
        obj["spec"]["gpuSharing"] = {"mode": mode, "mps": {"enabled": mps}}
        job = parse(obj)
        assert isinstance(job, PipelineTrainingJob)
        variants.append((f"{mode}-gpus{gpus}-mps{int(mps)}", job))
    return variants


@pytest.mark.parametrize(("variant", "job"), _sharing_variants(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_rank_pod_passes_server_side_dry_run(
    control_plane: ControlPlane, namespace: str, variant: str, job: PipelineTrainingJob
) -> None:
    priority = job.spec.scheduling.priority_class_name
    assert priority, "the example names a PriorityClass; admission checks that it exists"
    control_plane.apply(
        [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": priority}, "value": 1000}]
    )
    # the pods run as the fill executor's ServiceAccount, which admission checks exists
    control_plane.apply(fill_rbac(namespace=namespace))
    pods = [rank_pod(job, rank, namespace=namespace) for rank in (0, job.world_size - 1)]
    out = control_plane.kubectl(
        "create", "--dry-run=server", "--validate=strict", "-o", "json", "-f", "-",
        stdin=yaml.safe_dump_all(pods),
    )  # fmt: skip
    items, text, decoder = [], out.stdout.strip(), json.JSONDecoder()
    while text:  # kubectl prints one JSON object per created document
        obj, end = decoder.raw_decode(text)
        items.append(obj)
        text = text[end:].strip()
    assert [p["metadata"]["name"] for p in items] == [p["metadata"]["name"] for p in pods]
    assert all(p["spec"]["initContainers"][0]["restartPolicy"] == "Always" for p in items), variant


def test_dra_claim_is_allocated_by_the_scheduler_on_a_kwok_gpu_node(
    control_plane: ControlPlane, namespace: str
) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": namespace},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
        },
    }
    container = {"image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "uses-gpu", "namespace": namespace},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "trainer", **container}],
            "initContainers": [{"name": "fill", "restartPolicy": "Always", **container}],
        },
    }
    control_plane.apply([template, pod])
    control_plane.kubectl(
        "wait", "-n", namespace, "--for=jsonpath={.status.phase}=Running", "pod/uses-gpu", "--timeout=60s"
    )
    bound = _get(control_plane, namespace, "pod", "uses-gpu")
    assert bound["spec"]["nodeName"].startswith("kwok-node-")
    assert bound["status"]["podIP"].startswith("127.")
    (claim,) = _get(control_plane, namespace, "resourceclaims")["items"]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == "gpu.nvidia.com" and result["pool"] == bound["spec"]["nodeName"]
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["uses-gpu"]


def test_tainted_gpu_node_takes_only_pods_that_tolerate_it(control_plane: ControlPlane, namespace: str) -> None:
    tainted = f"kwok-node-{control_plane.nodes - 1}"
    base = {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    pinned = copy.deepcopy(base)
    pinned["metadata"] = {"name": "pinned", "namespace": namespace}
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": tainted}
    tolerating = copy.deepcopy(pinned)
    tolerating["metadata"]["name"] = "tolerating"
    tolerating["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    control_plane.apply([pinned, tolerating])
    control_plane.kubectl(
        "wait", "-n", namespace, "--for=jsonpath={.spec.nodeName}=" + tainted, "pod/tolerating", "--timeout=60s"
    )
    control_plane.kubectl(
        "wait", "-n", namespace, "--for=jsonpath={.status.conditions[?(@.type=='PodScheduled')].reason}=Unschedulable",
        "pod/pinned", "--timeout=60s",
    )  # fmt: skip
    assert "nodeName" not in _get(control_plane, namespace, "pod", "pinned")["spec"]
