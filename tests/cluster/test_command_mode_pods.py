"""spec.trainer on the real API server: the CRD admits a command-mode job and refuses spec.model beside it, and the
rank pods it renders (the hook's init container first, PYTHONPATH and the rank environment in the trainer alone,
the user's image and command) pass server-side admission."""

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
from pipefill.spec import PipelineTrainingJob, parse
from pipefill.usercommand import HOOK_DIR

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
DEMO: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "pipelining" / "pipelining-demo.yaml").read_text())


def test_a_command_mode_job_is_admitted_and_spec_model_beside_it_refused(
    control_plane: ControlPlane, namespace: str
) -> None:
    control_plane.kubectl("apply", "-n", namespace, "--validate=strict", "-f", "-", stdin=yaml.safe_dump(DEMO))
    bad = copy.deepcopy(DEMO)
    bad["metadata"]["name"] = "with-model"
    bad["spec"]["model"] = {"preset": "gpt-tiny"}
    refused = control_plane.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(bad), check=False)
    assert refused.returncode != 0 and "remove spec.model and spec.pipeline" in refused.stderr, refused.stderr


def test_the_command_mode_rank_pods_pass_server_side_admission(control_plane: ControlPlane, namespace: str) -> None:
    obj = copy.deepcopy(DEMO)
    obj["spec"]["trainer"]["image"] = "example.com/my-trainer:1"
    job = parse(obj)
    assert isinstance(job, PipelineTrainingJob)
    control_plane.apply(fill_rbac(namespace=namespace))  # the pods run as the fill executor's ServiceAccount
    pods = [rank_pod(job, rank, namespace=namespace) for rank in range(job.world_size)]
    out = control_plane.kubectl(
        "create", "--dry-run=server", "--validate=strict", "-o", "json", "-f", "-", stdin=yaml.safe_dump_all(pods)
    )
    items, text, decoder = [], out.stdout.strip(), json.JSONDecoder()
    while text:  # one JSON object per created document
        item, end = decoder.raw_decode(text)
        items.append(item)
        text = text[end:].strip()
    assert [p["metadata"]["name"] for p in items] == ["pipelining-demo-0", "pipelining-demo-1"]
    for rank, pod in enumerate(items):
        init = pod["spec"]["initContainers"]
        assert [c["name"] for c in init] == ["pipefill-hook", "fill-executor"]
        (trainer,) = pod["spec"]["containers"]
        assert trainer["image"] == "example.com/my-trainer:1"
        assert trainer["command"][:2] == ["python", "examples/pipelining/train.py"]
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        assert env["PYTHONPATH"] == f"{HOOK_DIR}/boot:{HOOK_DIR}/lib"
        assert (env["RANK"], env["LOCAL_RANK"], env["PET_NODE_RANK"]) == (str(rank), "0", str(rank))
        for container in init:
            names = {e["name"] for e in container.get("env", [])}
            assert not names & {"RANK", "WORLD_SIZE", "LOCAL_RANK", "PYTHONPATH", "PET_NNODES"}, container["name"]
