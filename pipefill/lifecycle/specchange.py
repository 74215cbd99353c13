"""How an edit of a running PipelineTrainingJob's spec is taken: at once, or by the next gang, never silently.

Admission refuses the fields that cannot change at all (``oldSelf`` rules, :mod:`pipefill.spec.immutable`). Of the
rest, the few the decision and the fill queue read from the spec on every look are taken at once (:data:`AT_ONCE`);
every other field is in the running pods, which cannot change: the next gang (a restart, or suspend and resume)
takes it, and until then the job says so with the SpecChangePending condition, naming the fields, and an Event
once per edit (docs/operator.md, "Changing a running job").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipefill.lifecycle.observe import PodView
from pipefill.spec import PipelineTrainingJob, to_obj

__all__ = ["AT_ONCE", "SpecChange", "changed_fields", "spec_change"]

AT_ONCE: tuple[str, ...] = (
    "spec.runPolicy.suspend",  # the gang is deleted (or created) at the next look
    "spec.runPolicy.backoffLimit",  # counted at the next failure
    "spec.runPolicy.restartOnExitCodes",  # an exit is classified when it is seen
    "spec.trainer.retryExitCodes",  # the same, for your own command
    "spec.runPolicy.activeDeadlineSeconds",  # checked at every look
    "spec.runPolicy.ttlSecondsAfterFinished",  # counted once the job has finished
    "spec.fill.jobSelector",  # the fill queue's next pass admits FillJobs by it
)
"""Fields taken at once: the operator's decision and the fill queue read them from the job on every look."""

_LISTED = 8  # fields named in a message; the rest are counted


def changed_fields(running: Any, now: Any, path: str = "spec") -> list[str]:
    """Dotted paths (``spec.optimizer.learningRate``) of the leaves where ``now`` differs from ``running`` (both
    as :func:`pipefill.spec.to_obj` writes a spec); a list counts as one leaf."""
    if isinstance(running, Mapping) and isinstance(now, Mapping):
        out: list[str] = []
        for key in sorted({*running, *now}):
            out += changed_fields(running.get(key), now.get(key), f"{path}.{key}")
        return out
    return [] if running == now else [path]


def _taken_at_once(field: str) -> bool:
    return any(field == f or field.startswith(f + ".") for f in AT_ONCE)


def _names(fields: list[str]) -> str:
    more = len(fields) - _LISTED
    return ", ".join(fields[:_LISTED]) + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class SpecChange:
    """What an edit of a running job's spec means for it."""

    pending: bool  # something in the running pods differs from the spec: the next gang takes it
    message: str


def spec_change(
    job: PipelineTrainingJob,
    running: Mapping[str, object] | None,
    pods: Sequence[PodView],
    *,
    job_generation: int,
) -> SpecChange | None:
    """What the job's edit means for its gang ``pods``; ``running``: the spec they were built from (None: not known
    here, so every change is taken to wait). None when no pod says what it was built from."""
    built = [p.spec_generation for p in pods if p.spec_generation is not None]
    if not built:
        return None
    oldest = min(built)
    if oldest >= job_generation:
        return SpecChange(False, f"the running pods carry spec generation {job_generation}")
    waits = "it applies when the gang next starts (a restart, or spec.runPolicy.suspend set and unset)"
    head = f"spec generation {job_generation} is not in the running pods (built from generation {oldest})"
    if running is None:
        return SpecChange(True, f"{head}: {waits}")
    fields = changed_fields(running, to_obj(job)["spec"])
    later = [f for f in fields if not _taken_at_once(f)]
    at_once = [f for f in fields if _taken_at_once(f)]
    taken = f"; taken at once: {_names(at_once)}" if at_once else ""
    if not later:
        what = f"only what is taken at once: {_names(at_once)}" if at_once else "nothing in the running pods"
        return SpecChange(False, f"spec generation {job_generation} changes {what}")
    return SpecChange(True, f"{_names(later)} changed: {head}; {waits}{taken}")
