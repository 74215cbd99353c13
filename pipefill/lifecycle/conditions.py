"""Conditions in the metav1.Condition shape: one per type, the transition time kept while the status stays."""

from __future__ import annotations

import datetime

from pipefill.spec.common import Condition

__all__ = ["ConditionType", "find", "is_true", "rfc3339", "set_condition"]


class ConditionType:
    """The condition types of a PipelineTrainingJob (docs/operator.md#conditions)."""

    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    INVALID_SPEC = "InvalidSpec"
    WAITING = "Waiting"
    CHECKPOINTS_SHARED = "CheckpointsShared"
    SPEC_CHANGE_PENDING = "SpecChangePending"
    START_BLOCKED = "StartBlocked"


def rfc3339(moment: datetime.datetime) -> str:
    """``2026-01-31T12:00:00Z``: the API server's timestamp form (seconds, UTC)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: list[Condition], kind: str) -> Condition | None:
    return next((c for c in conditions if c.type == kind), None)


def is_true(conditions: list[Condition], kind: str) -> bool:
    found = find(conditions, kind)
    return found is not None and found.status == "True"


def set_condition(
    conditions: list[Condition],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: str,
    generation: int | None,
) -> None:
    """Set (or add) the condition ``kind``; its transition time moves only when its status flips."""
    value = "True" if status else "False"
    found = find(conditions, kind)
    if found is None:
        conditions.append(Condition(kind, value, reason, message, now, generation))
        return
    if found.status != value:
        found.last_transition_time = now
    found.status, found.reason, found.message, found.observed_generation = value, reason, message, generation
