"""Exit codes are classified alike on both runners, and a rank pod's status is read into what the lifecycle needs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pipefill.lifecycle import ExitClass, PodView, Termination, classify, exit_code, exit_text, observe_pod

RESTART_ON = [75, 137, 143]


@pytest.mark.parametrize(
    ("returncode", "code", "cls", "text"),
    [
        (0, 0, ExitClass.SUCCEEDED, "exited with code 0"),
        (75, 75, ExitClass.RETRYABLE, "exited with code 75"),
        (1, 1, ExitClass.PERMANENT, "exited with code 1"),
        (2, 2, ExitClass.PERMANENT, "exited with code 2"),
        (-9, 137, ExitClass.RETRYABLE, "exited with code 137 (SIGKILL)"),
        (-15, 143, ExitClass.RETRYABLE, "exited with code 143 (SIGTERM)"),
        (-11, 139, ExitClass.PERMANENT, "exited with code 139 (SIGSEGV)"),
        (137, 137, ExitClass.RETRYABLE, "exited with code 137 (SIGKILL)"),
        (255, 255, ExitClass.PERMANENT, "exited with code 255 (signal 127)"),
    ],
)
def test_local_return_codes_map_to_the_kubelets_and_classify_alike(
    returncode: int, code: int, cls: ExitClass, text: str
) -> None:
    assert exit_code(returncode) == code
    assert classify(code, RESTART_ON) == cls
    assert exit_text(code) == text


def test_restart_on_exit_codes_is_the_only_list() -> None:
    assert classify(137, [75]) == ExitClass.PERMANENT
    assert classify(1, [1]) == ExitClass.RETRYABLE


POD: dict[str, Any] = {
    "metadata": {"name": "j-1", "labels": {"pipefill.io/rank": "1", "pipefill.io/generation": "2"}},
    "status": {
        "phase": "Running",
        "podIP": "127.0.0.5",
        "containerStatuses": [{"name": "trainer", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
        "initContainerStatuses": [{"name": "fill-executor", "restartCount": 3, "state": {"running": {}}}],
    },
}


def _pod(**status: Any) -> dict[str, Any]:
    pod = copy.deepcopy(POD)
    pod["status"].update(status)
    return pod


def test_a_running_rank() -> None:
    view = observe_pod(POD)
    assert view == PodView(
        name="j-1",
        rank=1,
        generation=2,
        phase="Running",
        deleting=False,
        trainer_running=True,
        fill_restarts=3,
        pod_ip="127.0.0.5",
    )


def test_a_terminated_trainer_carries_code_reason_and_message() -> None:
    terminated = {"exitCode": 75, "reason": "Error", "message": "  peer rank 0 vanished\n"}
    view = observe_pod(
        _pod(phase="Failed", containerStatuses=[{"name": "trainer", "state": {"terminated": terminated}}])
    )
    assert view is not None
    assert view.trainer == Termination(75, "Error", "peer rank 0 vanished")
    assert not view.trainer_running and view.failure is None and view.disruption is None


def test_disruptions_and_failures_without_a_trainer_exit() -> None:
    evicted = observe_pod(_pod(phase="Failed", reason="Evicted", message="node low on memory"))
    assert evicted is not None and evicted.disruption == "Evicted: node low on memory"
    target = _pod(conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}])
    view = observe_pod(target)
    assert view is not None and view.disruption == "PreemptionByScheduler"
    rejected = observe_pod(
        _pod(phase="Failed", reason="UnexpectedAdmissionError", message="no GPU", containerStatuses=[])
    )
    assert rejected is not None and rejected.failure == "UnexpectedAdmissionError: no GPU"
    deleting = copy.deepcopy(POD)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    view = observe_pod(deleting)
    assert view is not None and view.deleting


def test_pods_without_our_labels_are_not_ranks() -> None:
    assert observe_pod({"metadata": {"name": "x", "labels": {"pipefill.io/rank": "a"}}}) is None
    assert observe_pod({"metadata": {"name": "x"}}) is None
