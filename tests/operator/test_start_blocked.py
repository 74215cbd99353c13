"""Containers that cannot start (an image the node cannot pull, a container it cannot create), decided by the pure
lifecycle: pod status dicts as a kubelet writes them → the StartBlocked condition and one Warning Event per distinct
problem, cleared once the gang runs; the job keeps waiting (docs/operator.md, "Containers that cannot start")."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from operator_harness import job_manifest

from pipefill.lifecycle import Decision, Observed, decide, observe_pod
from pipefill.lifecycle.conditions import find
from pipefill.lifecycle.images import stuck_containers
from pipefill.spec import JobPhase, PipelineTrainingJob, PipelineTrainingJobStatus, parse
from pipefill_operator.cache import project_pod

T0 = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
WORLD = 2
IMAGE = "registry.example/team/trainer:v9"
FILL_IMAGE = "ghcr.io/pipefill/fill:0.1.0"
PULL_ERROR = f'failed to pull and unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": not found'


def _job(**run_policy: Any) -> PipelineTrainingJob:
    """The cluster tests' 2-rank job, with the trainer image the kubelet cannot pull."""
    job = parse(job_manifest("j", trainerImage=IMAGE, runPolicy=run_policy))
    assert isinstance(job, PipelineTrainingJob)
    return job


def _waiting(name: str, image: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "restartCount": 0,
        "state": {"waiting": {"reason": reason, "message": message}},
    }


def _running(name: str, image: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "restartCount": 0,
        "state": {"running": {"startedAt": "2026-03-01T12:00:00Z"}},
    }


def _pod(
    rank: int, *, trainer: dict[str, Any] | None = None, fill: dict[str, Any] | None = None, gen: int = 0
) -> dict[str, Any]:
    """A rank pod as the kubelet reports it: the trainer (default: waiting on its image) and the fill sidecar."""
    trainer = trainer or _waiting("trainer", IMAGE, "ErrImagePull", PULL_ERROR)
    fill = fill or _running("fill-executor", FILL_IMAGE)
    phase = "Running" if "running" in trainer["state"] else "Pending"
    return {
        "metadata": {
            "name": f"j-{rank}",
            "labels": {"pipefill.io/rank": str(rank), "pipefill.io/generation": str(gen)},
        },
        "status": {"phase": phase, "containerStatuses": [trainer], "initContainerStatuses": [fill]},
    }


def _step(status: PipelineTrainingJobStatus, pods: list[dict[str, Any]], *, at_s: float = 0, **policy: Any) -> Decision:
    views = [v for v in (observe_pod(project_pod(p)) for p in pods) if v is not None]  # through the operator's cache
    now = T0 + datetime.timedelta(seconds=at_s)
    return decide(_job(**policy), status, Observed(pods=views, now=now), job_generation=1)


def _created() -> PipelineTrainingJobStatus:
    return _step(PipelineTrainingJobStatus(), []).status


def _blocked(d: Decision) -> tuple[str, str, str] | None:
    found = find(d.status.conditions, "StartBlocked")
    return None if found is None else (found.status, found.reason, found.message)


def _warnings(d: Decision) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in d.events if e.type == "Warning"]


def test_only_the_reasons_that_block_a_start_are_read_from_every_container_kind() -> None:
    status = {
        "initContainerStatuses": [
            _waiting("pipefill-hook", IMAGE, "InvalidImageName", 'invalid reference format: "Bad:Tag"'),
            _waiting("fill-executor", FILL_IMAGE, "CreateContainerConfigError", 'secret "hf-token" not found'),
        ],
        "containerStatuses": [
            _waiting("trainer", IMAGE, "ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'),
            _waiting("other", IMAGE, "ContainerCreating", ""),
            _waiting("crashing", IMAGE, "CrashLoopBackOff", "back-off 10s restarting failed container"),
            _waiting("never", IMAGE, "ErrImageNeverPull", "image is not present with pull policy of Never"),
            _waiting("create", IMAGE, "CreateContainerError", "failed to reserve container name"),
        ],
    }
    got = [(s.container, s.reason) for s in stuck_containers(status)]
    assert got == [
        ("pipefill-hook", "InvalidImageName"),
        ("fill-executor", "CreateContainerConfigError"),
        ("trainer", "ImagePullBackOff"),
        ("never", "ErrImageNeverPull"),
        ("create", "CreateContainerError"),
    ]
    # the operator's cache keeps them, with the image, and keeps no image of a container that started
    projected = project_pod({"metadata": {}, "status": status})["status"]
    assert [s["name"] for s in projected["initContainerStatuses"]] == ["pipefill-hook", "fill-executor"]
    assert "image" not in project_pod(_pod(0, trainer=_running("trainer", IMAGE)))["status"]["containerStatuses"][0]


def test_a_gang_that_cannot_pull_its_image_is_reported_once_with_pod_container_image_message_and_fix() -> None:
    d = _step(_created(), [_pod(0), _pod(1)])
    status, reason, message = _blocked(d) or ("", "", "")
    assert (status, reason, d.status.phase) == ("True", "ImagePullFailed", JobPhase.PENDING)
    for part in (
        "container trainer",
        f'image "{IMAGE}"',
        "rank 0 (pod j-0) and 1 more rank",
        "ErrImagePull",
        PULL_ERROR,
    ):
        assert part in message, part
    for fix in (
        "spec.trainerImage",
        "spec.podTemplate.imagePullSecrets",
        "reach the registry",
        "spec.runPolicy.suspend",
    ):
        assert fix in message, fix
    ((event_reason, event_message),) = _warnings(d)
    assert event_reason == "ImagePullFailed"
    for part in ("pod j-0", "container trainer", IMAGE, PULL_ERROR, "imagePullSecrets"):
        assert part in event_message, part
    assert not d.delete_pods and not d.create_ranks


def test_the_kubelets_back_off_and_retries_change_nothing() -> None:
    first = _step(_created(), [_pod(0)])
    back_off = _waiting("trainer", IMAGE, "ImagePullBackOff", f'Back-off pulling image "{IMAGE}": ErrImagePull: oops')
    # the kubelet alternates between its two reasons and wordings for hours; rank 1 shows the same problem later
    for at_s, pods in (
        (10, [_pod(0, trainer=back_off)]),
        (20, [_pod(0), _pod(1)]),
        (86_400, [_pod(0, trainer=back_off)]),
    ):
        again = _step(first.status, pods, at_s=at_s)
        assert (again.events, again.status) == ([], first.status), at_s
    assert first.status.phase == JobPhase.PENDING  # the job waits: the kubelet retries for ever, it may heal


def test_each_new_problem_gets_its_own_event_and_a_fixed_one_leaves_the_message() -> None:
    first = _step(_created(), [_pod(0), _pod(1)])
    fill_stuck = _waiting("fill-executor", FILL_IMAGE, "CreateContainerConfigError", 'secret "hf-token" not found')
    both = _step(first.status, [_pod(0, fill=fill_stuck), _pod(1)])
    ((reason, message),) = _warnings(both)
    assert reason == "ContainerConfigError" and 'secret "hf-token" not found' in message and "Secrets" in message
    status, kind, text = _blocked(both) or ("", "", "")
    assert (status, kind) == ("True", "ImagePullFailed")  # the first one's kind, like Waiting
    assert "container trainer cannot pull" in text and "container fill-executor" in text
    fixed_image = _step(both.status, [_pod(r, trainer=_running("trainer", IMAGE), fill=fill_stuck) for r in (0, 1)])
    assert not fixed_image.events
    status, kind, text = _blocked(fixed_image) or ("", "", "")
    assert (status, kind) == ("True", "ContainerConfigError") and "cannot pull" not in text


def test_it_clears_once_the_gang_runs_and_a_restarted_gang_meeting_it_again_is_not_news() -> None:
    first = _step(_created(), [_pod(0), _pod(1)])
    between = _step(first.status, [])  # pods gone (deleted by someone, a restart): the report stands
    assert _blocked(between) == _blocked(first) and not _warnings(between)
    again = _step(between.status, [_pod(0), _pod(1)])
    assert not _warnings(again)
    runs = _step(again.status, [_pod(r, trainer=_running("trainer", IMAGE)) for r in (0, 1)])
    assert runs.status.phase == JobPhase.RUNNING and not _warnings(runs)
    assert _blocked(runs) == ("False", "ContainersStarted", "every container of all 2 ranks started")
    assert _step(runs.status, [_pod(r, trainer=_running("trainer", IMAGE)) for r in (0, 1)]).status == runs.status


def test_a_sidecar_that_cannot_pull_while_training_runs_is_reported_and_training_goes_on() -> None:
    running = _step(_created(), [_pod(r, trainer=_running("trainer", IMAGE)) for r in (0, 1)])
    assert _blocked(running) is None  # never blocked: no condition at all
    stuck = _waiting("fill-executor", FILL_IMAGE, "ImagePullBackOff", f'Back-off pulling image "{FILL_IMAGE}"')
    d = _step(
        running.status,
        [_pod(0, trainer=_running("trainer", IMAGE), fill=stuck), _pod(1, trainer=_running("trainer", IMAGE))],
    )
    assert d.status.phase == JobPhase.RUNNING and (_blocked(d) or ("",))[0] == "True"
    assert [r for r, _ in _warnings(d)] == ["ImagePullFailed"] and "spec.fillImage" in _warnings(d)[0][1]


def test_the_wait_is_bounded_only_by_the_active_deadline() -> None:
    first = _step(_created(), [_pod(0), _pod(1)], activeDeadlineSeconds=600)
    late = _step(first.status, [_pod(0), _pod(1)], at_s=601, activeDeadlineSeconds=600)
    assert late.status.phase == JobPhase.FAILED
    assert [e.reason for e in late.events] == ["DeadlineExceeded"]
    assert (_blocked(late) or ("",))[0] == "True"  # why it never started stays on the failed job


@pytest.mark.parametrize("chars", [10, 5000])
def test_an_event_fits_the_api_servers_limit_and_still_names_the_fix(chars: int) -> None:
    long = _waiting("trainer", IMAGE, "ErrImagePull", "x" * chars)
    d = _step(_created(), [_pod(0, trainer=long)])
    ((_, message),) = _warnings(d)
    assert len(message) <= 1024 and message.endswith("set spec.runPolicy.suspend to true, then to false")
