"""Rank pods whose containers cannot start: an image the node cannot pull, or a container it cannot create.

The kubelet retries such a container for ever — ErrImagePull and ImagePullBackOff take turns while its back-off grows
to 5 minutes — and the pod stays Pending, holding its node's GPUs, without a word on the job. The decision reports it
as the StartBlocked condition (True, reason ``ImagePullFailed`` or ``ContainerConfigError``) naming, for each
distinct problem, the container, the image, a pod that shows it, the kubelet's own message and the fix, and posts one
Warning Event per problem. A *problem* is (reason, container, image): the kubelet's turns between its two pull
reasons, its changing wording, more ranks showing the same problem or a restarted gang meeting it again change
nothing, so a job stuck for days costs one status write and one Event per problem, not one per pod event. The
condition clears (False, ``ContainersStarted``) once every rank's trainer runs. The job keeps waiting meanwhile: a
registry outage or a pull Secret created late heals by itself, and ``spec.runPolicy.activeDeadlineSeconds`` bounds
the wait for those who want a bound (docs/operator.md, "Containers that cannot start").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipefill.spec.common import Condition

if TYPE_CHECKING:
    from pipefill.lifecycle.observe import PodView

__all__ = [
    "BLOCKED_REASONS",
    "CREATE_REASONS",
    "PULL_REASONS",
    "StartBlocked",
    "StuckContainer",
    "is_stuck",
    "start_blocked",
    "stuck_containers",
]

PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
"""The kubelet's waiting reasons of a container whose image it cannot get."""
CREATE_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError"})
"""The kubelet's waiting reasons of a container it cannot create (a missing Secret or ConfigMap key, a bad setting)."""
BLOCKED_REASONS = PULL_REASONS | CREATE_REASONS

IMAGE_PULL_FAILED = "ImagePullFailed"
CONTAINER_CONFIG_ERROR = "ContainerConfigError"
CONTAINERS_STARTED = "ContainersStarted"

_KUBELET_CHARS = 512  # of the kubelet's message kept per container (they quote whole registry answers)
_EVENT_KUBELET_CHARS = 300  # of it in an Event, whose message the operator cuts at 1 024 characters
_MESSAGE_CHARS = 32768  # of the condition's message (the CRD's limit)
# where a container's image comes from in the spec
_IMAGE_FIELDS = {
    "trainer": "spec.trainerImage, or spec.trainer.image for your own command",
    "fill-executor": "spec.fillImage",
    "pipefill-hook": "spec.trainerImage",
}
_NEXT_GANG = "a corrected spec is taken by the next gang: set spec.runPolicy.suspend to true, then to false"


@dataclass(frozen=True)
class StuckContainer:
    """A container the kubelet reports waiting for one of :data:`BLOCKED_REASONS`."""

    container: str
    image: str
    reason: str  # the kubelet's: ErrImagePull, ImagePullBackOff, ..., CreateContainerConfigError
    message: str  # the kubelet's


def is_stuck(entry: Mapping[str, Any]) -> bool:
    """Whether a container status ``entry`` waits for a reason that keeps it from starting (:data:`BLOCKED_REASONS`)."""
    return ((entry.get("state") or {}).get("waiting") or {}).get("reason") in BLOCKED_REASONS


def stuck_containers(status: Mapping[str, Any]) -> tuple[StuckContainer, ...]:
    """The containers of a pod's ``status`` (init containers first, as the kubelet starts them) that cannot start."""
    out = []
    for field in ("initContainerStatuses", "containerStatuses"):
        for entry in status.get(field) or ():
            if is_stuck(entry):
                waiting = entry["state"]["waiting"]
                reason = str(waiting["reason"])
                message = " ".join(str(waiting.get("message") or "").split())[:_KUBELET_CHARS]
                out.append(StuckContainer(str(entry.get("name", "")), str(entry.get("image") or ""), reason, message))
    return tuple(out)


@dataclass(frozen=True)
class StartBlocked:
    """What to do about the StartBlocked condition: set it to ``condition`` (status, reason, message; None: leave
    it as it is) and post ``events`` (reason, message), each a Warning."""

    condition: tuple[bool, str, str] | None = None
    events: tuple[tuple[str, str], ...] = ()


_Key = tuple[str, str, str]  # (reason of the condition, container, image): one problem


def _kind(reason: str) -> str:
    return IMAGE_PULL_FAILED if reason in PULL_REASONS else CONTAINER_CONFIG_ERROR


def _title(key: _Key) -> str:
    kind, container, image = key
    if kind == IMAGE_PULL_FAILED:
        return f'container {container} cannot pull image "{image}"'
    return f'container {container} (image "{image}") cannot be created'


def _fix(key: _Key) -> str:
    kind, container, _ = key
    if kind == IMAGE_PULL_FAILED:
        where = _IMAGE_FIELDS.get(container, "the spec")
        return (
            f"check the image name and tag ({where}), that spec.podTemplate.imagePullSecrets names a Secret in the "
            f"job's namespace that may pull it, and that the nodes reach the registry; {_NEXT_GANG}"
        )
    return (
        "check that the Secrets and ConfigMaps (and keys) named by spec.podTemplate's env, envFrom and volumes exist "
        f"in the job's namespace (the kubelet retries until they do) and the container's settings; {_NEXT_GANG}"
    )


def _where(seen: list[tuple[int, str, StuckContainer]]) -> str:
    rank, pod, stuck = seen[0]
    more = len({r for r, _, _ in seen}) - 1
    others = f" and {more} more rank{'s' if more > 1 else ''}" if more else ""
    return f"rank {rank} (pod {pod}){others}: {stuck.reason}: {stuck.message or 'no message'}"


def start_blocked(pods: Sequence[PodView], was: Condition | None, *, started: bool) -> StartBlocked:
    """What the gang's ``pods`` say about StartBlocked, given the condition as it ``was`` (None: absent); ``started``:
    every rank's trainer runs."""
    reported = was is not None and was.status == "True"
    problems: dict[_Key, list[tuple[int, str, StuckContainer]]] = {}
    for pod in sorted(pods, key=lambda p: p.rank):
        for stuck in pod.stuck:
            problems.setdefault((_kind(stuck.reason), stuck.container, stuck.image), []).append(
                (pod.rank, pod.name, stuck)
            )
    if not problems:
        if reported and started:
            return StartBlocked((False, CONTAINERS_STARTED, f"every container of all {len(pods)} ranks started"))
        return StartBlocked()  # a gang between generations, or still pulling: the last report stands
    keys = sorted(problems, key=lambda k: (k[0] != IMAGE_PULL_FAILED, problems[k][0][0], k[1], k[2]))
    summary = "; ".join(_title(k) for k in keys)
    before = was.message.split(". ", 1)[0] if was is not None and reported else ""
    if before == summary:
        return StartBlocked()  # the same problems: told once (the kubelet's words and the ranks showing them vary)
    details = "; ".join(f"{k[1]} on {_where(problems[k])}" for k in keys)
    fixes = " Also: ".join(dict.fromkeys(_fix(k) for k in keys))
    message = f"{summary}. {details}. Fix: {fixes}"[:_MESSAGE_CHARS]
    new = [k for k in keys if _title(k) not in before.split("; ")]
    events = tuple(
        (k[0], f"{_title(k)} on {_where(problems[k])[: _EVENT_KUBELET_CHARS + 80]}. Fix: {_fix(k)}") for k in new
    )
    return StartBlocked((True, keys[0][0], message), events)
