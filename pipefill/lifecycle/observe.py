"""What the lifecycle needs to know about one rank pod, read from the Pod object the API server returns.

Only the pod's status is read, never its logs: the trainer's exit code and termination message (the kubelet keeps the
end of the log there, ``FallbackToLogsOnError``), whether it is running, the fill sidecar's restart count, and the
signs of a disruption (``DisruptionTarget``, an eviction by the kubelet), and the containers that cannot start
(:mod:`pipefill.lifecycle.images`).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from pipefill.lifecycle.images import StuckContainer, stuck_containers
from pipefill.pods import GENERATION_LABEL, RANK_LABEL, SPEC_GENERATION_LABEL

__all__ = ["DISRUPTION_REASONS", "FillExit", "PodView", "Termination", "observe_pod"]

# Pod status reasons of a pod the node took away (kubelet eviction, node shutdown, a lost node).
DISRUPTION_REASONS = frozenset({"Evicted", "NodeLost", "Shutdown", "Terminated", "NodeShutdown"})
_MESSAGE_CHARS = 1024


@dataclass(frozen=True)
class Termination:
    """How the trainer container ended."""

    exit_code: int
    reason: str  # the kubelet's: Error, Completed, OOMKilled, ...
    message: str  # the termination message (the end of the log when the trainer wrote none)


@dataclass(frozen=True)
class FillExit:
    """A rank's fill executor has exited and nobody started it again yet: what ``pipefill local`` reports, as the
    kubelet's part is its own there (:mod:`pipefill.lifecycle.sidecars`); on a cluster the kubelet restarts the
    sidecar and a pod never shows one."""

    exit_code: int  # the kubelet's form (a signal death is 128 + N)
    at: datetime.datetime  # when its exit was first seen
    left_with_trainer: bool = False  # it left because its trainer stopped announcing (its exit record: "trainer gone")


@dataclass(frozen=True)
class PodView:
    """One rank pod as the lifecycle sees it."""

    name: str
    rank: int
    generation: int
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    deleting: bool  # metadata.deletionTimestamp is set
    trainer: Termination | None = None  # set once the trainer container has terminated
    trainer_running: bool = False
    fill_restarts: int = 0
    fill_last_exit: int | None = None  # how the fill executor last ended (lastState.terminated.exitCode), if it did
    fill_exit: FillExit | None = None  # pipefill local: it has exited and waits for its restart (sidecars.py)
    disruption: str | None = None  # why the cluster took the pod away (DisruptionTarget reason, Evicted, ...)
    failure: str | None = None  # the pod failed without a trainer exit code (e.g. rejected by the kubelet)
    pod_ip: str | None = None
    spec_generation: int | None = None  # the job's metadata.generation the pod was built from (None: not labelled)
    stuck: tuple[StuckContainer, ...] = ()  # containers waiting on an image pull or a create that fails (images.py)


def _container(statuses: list[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    return next((s for s in statuses or () if s.get("name") == name), {})


def _disruption(status: dict[str, Any]) -> str | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            detail = cond.get("message") or ""
            return f"{cond.get('reason') or 'DisruptionTarget'}{': ' + detail if detail else ''}"
    if status.get("reason") in DISRUPTION_REASONS:
        return f"{status['reason']}: {status.get('message') or ''}".rstrip(": ")
    return None


def observe_pod(pod: dict[str, Any]) -> PodView | None:
    """The view of a rank pod; None for a pod without our rank and generation labels."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    try:
        rank, generation = int(labels[RANK_LABEL]), int(labels[GENERATION_LABEL])
    except (KeyError, TypeError, ValueError):
        return None
    trainer = _container(status.get("containerStatuses"), "trainer")
    state = trainer.get("state") or {}
    terminated = state.get("terminated")
    ended = None
    if terminated is not None:
        ended = Termination(
            exit_code=int(terminated.get("exitCode", 0)),
            reason=str(terminated.get("reason") or ""),
            message=str(terminated.get("message") or "").strip()[-_MESSAGE_CHARS:],
        )
    phase = str(status.get("phase") or "Pending")
    failure = None
    if phase == "Failed" and ended is None:
        failure = (
            f"{status.get('reason') or 'Failed'}: {status.get('message') or 'the pod failed before its trainer ran'}"
        )
    fill = _container(status.get("initContainerStatuses"), "fill-executor")
    return PodView(
        name=str(meta.get("name", "")),
        rank=rank,
        generation=generation,
        phase=phase,
        deleting=meta.get("deletionTimestamp") is not None,
        trainer=ended,
        trainer_running="running" in state,
        fill_restarts=int(fill.get("restartCount") or 0),
        fill_last_exit=_int_or_none(((fill.get("lastState") or {}).get("terminated") or {}).get("exitCode")),
        disruption=_disruption(status),
        failure=failure,
        pod_ip=status.get("podIP"),
        spec_generation=_int_or_none(labels.get(SPEC_GENERATION_LABEL)),
        stuck=stuck_containers(status),
    )


def _int_or_none(text: object) -> int | None:
    try:
        return int(str(text)) if text is not None else None
    except ValueError:
        return None
