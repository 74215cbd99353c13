"""What the queue writes into a FillJob's status after a scheduling pass: a pure function of the FillJob as the pass
saw it and the pass's :class:`~pipefill.queue.JobOutcome` (docs/fill.md, "The queue on the cluster"). The operator
sends it as a merge patch of the status subresource; ``pipefill local`` writes it into the job's status file.

The queue writes what :data:`pipefill.spec.fillstatus.STATUS_WRITERS` gives it — ``slices`` (written once, when the
plan is fixed), ``assignments``, ``epoch``, ``phase`` until a verdict, ``message``, ``samplesDone`` and ``progress``
from the commit pointers, ``startTime``, the ``Scheduled`` condition and the pruning of ``unfit`` — and every patch is
checked against the table; the executors own the commit pointers, their reports and the verdict. The patch is sent
with the FillJob's resourceVersion, so a commit that landed after the index's copy makes it fail (409) instead of
being overwritten, and the next pass starts from the newer status.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from typing import Any

from pipefill.queue.scheduler import JobOutcome
from pipefill.queue.snapshot import Placement
from pipefill.queue.status import FINAL_PHASES, check_patch, output_report
from pipefill.spec import FillJobPhase
from pipefill.spec.fillstatus import MAX_MESSAGE_CHARS, Writer

__all__ = ["SCHEDULED", "Decision", "decide"]

SCHEDULED = "Scheduled"
_QUEUED, _RUNNING = FillJobPhase.QUEUED.value, FillJobPhase.RUNNING.value
_CANCELLED = FillJobPhase.CANCELLED.value


@dataclass(frozen=True)
class Decision:
    """The status fields to change (None: nothing), and the placements it releases whose slices are not done, with
    why (``pod_gone``, ``unfit``, ``suspended``, ``cancelled``) for the reassignment counter."""

    patch: dict[str, Any] | None
    released: tuple[tuple[Placement, str], ...] = ()


def _assignment(p: Placement) -> dict[str, Any]:
    return {
        "trainingJob": p.training_job,
        "rank": p.rank,
        "start": p.start,
        "end": p.end,
        "pod": p.pod,
        "podUID": p.pod_uid,
        "epoch": p.epoch,
    }


def _condition(old: list[dict[str, Any]], status: bool, reason: str, message: str, now: str) -> list[dict[str, Any]]:
    """``old`` with the Scheduled condition set; its transition time moves only when its status flips."""
    value = "True" if status else "False"
    out = [dict(c) for c in old if c.get("type") != SCHEDULED]
    found = next((c for c in old if c.get("type") == SCHEDULED), None)
    since = found.get("lastTransitionTime") if found is not None and found.get("status") == value else None
    out.append(
        {
            "type": SCHEDULED,
            "status": value,
            "reason": reason,
            "message": message[:32768],
            "lastTransitionTime": since or now,
        }
    )
    return out


def _done(slices: list[dict[str, Any]]) -> int:
    return sum(int(s["committed"]) - int(s["start"]) for s in slices)


def _progress(status: dict[str, Any], slices: list[dict[str, Any]], new: dict[str, Any]) -> None:
    """``samplesDone`` and ``progress`` (the queue's) from the commit pointers (the executors'); never backwards."""
    done = _done(slices)
    if slices and done > int(status.get("samplesDone") or 0):
        new["samplesDone"] = done
        new["progress"] = round(100.0 * done / int(slices[-1]["end"]), 3)


def decide(
    body: dict[str, Any], outcome: JobOutcome | None, *, running_hosts: Set[tuple[str, str]], now: str
) -> Decision:
    """The change to ``body``'s status after a pass (see :func:`_decide`), refused (ValueError) should it write what
    the ownership table (:data:`pipefill.spec.fillstatus.STATUS_WRITERS`) gives the executors."""
    decision = _decide(body, outcome, running_hosts=running_hosts, now=now)
    if decision.patch is not None:
        check_patch(Writer.QUEUE, body.get("status") or {}, decision.patch)
    return decision


def _decide(
    body: dict[str, Any], outcome: JobOutcome | None, *, running_hosts: Set[tuple[str, str]], now: str
) -> Decision:
    """The change to ``body``'s status after a pass. ``outcome``: the job's (None: the pass left it out, e.g. an
    unreadable spec); ``running_hosts``: (namespace, name) of the Running training jobs (unfit reports of others are
    dropped: a restarted or new gang may have other bubbles)."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    namespace = str(body["metadata"]["namespace"])
    phase = str(status.get("phase") or _QUEUED)
    slices: list[dict[str, Any]] = list(status.get("slices") or ())
    new: dict[str, Any] = {}
    released: list[tuple[Placement, str]] = []
    conditions = list(status.get("conditions") or ())
    _progress(status, slices, new)  # the commit pointers' sum, whatever the phase: the last ones come with a verdict
    if phase in FINAL_PHASES:
        if status.get("assignments"):
            new["assignments"] = []  # nothing runs any more
        if phase == FillJobPhase.SUCCEEDED.value:  # an executor completed it (outputs assembled, finalize run)
            why = "every slice committed and the job completed"
            new["conditions"] = _condition(conditions, False, "Completed", why, now)
        return Decision(_changed(status, new))
    if outcome is not None and outcome.planned and not slices:
        slices = [{"start": s.start, "end": s.end, "committed": s.committed} for s in outcome.slices]
        new["slices"] = slices
        output = spec.get("output") or {}
        new["output"] = output_report(
            path=str(output.get("path", "")),
            claim_name=output.get("claimName"),
            kind=str((spec.get("workload") or {}).get("kind", "")),
        )
    total = int(slices[-1]["end"]) if slices else 0
    done = _done(slices)
    if spec.get("cancel"):
        why = "cancelled (spec.cancel): assignments revoked"
        released += [(p, "cancelled") for p in (outcome.released if outcome else ()) if not _slice_done(slices, p)]
        new.update(phase=_CANCELLED, assignments=[], completionTime=now, message=f"{why}; {done} of {total} committed")
        new["conditions"] = _condition(conditions, False, "Cancelled", why, now)
    elif outcome is None:
        return Decision(_changed(status, new))
    elif spec.get("suspend"):
        released += [(p, "suspended") for p in outcome.released if not _slice_done(slices, p)]
        why = f"suspended (spec.suspend): assignments released, {done} of {total or '?'} committed kept"
        new.update(phase=_QUEUED, assignments=[], message=why)
        new["conditions"] = _condition(conditions, False, "Suspended", why, now)
    else:
        for p in outcome.released:
            if not _slice_done(slices, p):
                reported = any(
                    (u.get("trainingJob"), u.get("rank")) == (p.training_job, p.rank) for u in status.get("unfit") or ()
                )
                released.append((p, "unfit" if reported else "pod_gone"))
        placed = [_assignment(p) for p in outcome.assignments]
        new.update(assignments=placed, epoch=outcome.epoch, phase=_RUNNING if placed else _QUEUED)
        if placed and not status.get("startTime"):
            new["startTime"] = now
        if outcome.code:
            new["message"] = outcome.reason
            new["conditions"] = _condition(conditions, False, outcome.code, outcome.reason, now)
        elif placed and slices and done == total:  # Succeeded comes from the executor that completes it
            p = outcome.assignments[0]
            why = (
                f"every slice committed; the executor of {p.training_job}/{p.rank} completes the job (assembles the "
                "outputs, runs the workload's finalize) and reports Succeeded"
            )
            new["message"] = why
            new["conditions"] = _condition(conditions, True, "Completing", why, now)
        elif placed:
            hosts = sorted({f"{p.training_job}/{p.rank}" for p in outcome.assignments})
            more = f" and {len(hosts) - 8} more" if len(hosts) > 8 else ""
            why = f"{len(placed)} slices on {', '.join(hosts[:8])}{more}"
            new["message"] = why
            new["conditions"] = _condition(conditions, True, "Assigned", why, now)
    if "message" in new:  # the status schema's bound (executors' unfit messages are quoted in reasons)
        new["message"] = new["message"][:MAX_MESSAGE_CHARS]
    unfit = list(status.get("unfit") or ())
    kept = [u for u in unfit if (namespace, u.get("trainingJob")) in running_hosts]
    if len(kept) != len(unfit):
        new["unfit"] = kept
    return Decision(_changed(status, new), tuple(released))


def _slice_done(slices: list[dict[str, Any]], p: Placement) -> bool:
    return any(int(s["start"]) == p.start and int(s["committed"]) >= int(s["end"]) for s in slices)


def _changed(status: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """Only what differs; a condition whose type, status, reason and message stay is not rewritten (its time)."""
    out = {k: v for k, v in new.items() if status.get(k) != v}
    if "conditions" in out:
        strip = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in out["conditions"]]
        if strip == [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or ()]:
            del out["conditions"]
    if "completionTime" in out and set(out) == {"completionTime"}:
        return None
    return out or None
