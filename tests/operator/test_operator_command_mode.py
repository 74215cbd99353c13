"""A job running its own command (spec.trainer) under the operator on the real control plane: its gang runs with
the hook's init container and the rank environment, and an exit 1 (torchrun's on any worker failure) restarts the
gang by default (spec.trainer.retryExitCodes) instead of failing the job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from operator_harness import Kube, OperatorProcess, condition, job_manifest, phase, running

from pipefill.devcluster import ControlPlane
from pipefill.usercommand import HOOK_DIR

pytestmark = pytest.mark.cluster


def _command_job(**trainer: Any) -> dict[str, Any]:
    obj = job_manifest("cmd")
    for key in ("model", "pipeline"):
        obj["spec"].pop(key, None)
    obj["spec"]["trainer"] = {"command": ["torchrun"], "args": ["-m", "torchtitan.train"], "stages": 2, **trainer}
    return obj


def test_the_gang_runs_the_command_hooked_and_exit_1_restarts_it(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    kube.create_job(namespace, _command_job(image="example.com/titan:1"))
    pods = kube.wait_pods(namespace, "cmd", running(2))
    for pod in pods:
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["pipefill-hook", "fill-executor"]
        (trainer,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        assert trainer["image"] == "example.com/titan:1" and trainer["command"] == [
            "torchrun",
            "-m",
            "torchtitan.train",
        ]
        assert env["PYTHONPATH"] == f"{HOOK_DIR}/boot:{HOOK_DIR}/lib" and env["PET_NNODES"] == "2"
    kube.wait_job(namespace, "cmd", phase("Running"))
    kube.end_trainer(namespace, "cmd-1", 1, "ChildFailedError: a peer died")
    job = kube.wait_job(namespace, "cmd", lambda j: (j.get("status") or {}).get("generation") == 1)
    assert job["status"]["restarts"] == 1
    kube.wait_pods(namespace, "cmd", running(2, generation=1))


def test_with_no_retry_codes_exit_1_fails_the_job(
    control_plane: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> None:
    start_operator()
    kube.create_job(namespace, _command_job(retryExitCodes=[], hook=False))
    pods = kube.wait_pods(namespace, "cmd", running(2))
    assert all([c["name"] for c in p["spec"]["initContainers"]] == ["fill-executor"] for p in pods)
    kube.end_trainer(namespace, "cmd-0", 1, "Traceback: a bug")
    job = kube.wait_job(namespace, "cmd", phase("Failed"))
    assert (condition(job, "Failed") or {}).get("reason") == "TrainerFailed"
