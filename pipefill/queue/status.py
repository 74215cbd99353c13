"""FillJob status written by several executors at once: what a progress report is and how it is merged.

Each executor reports the job's progress as it reads it from the job's output directory (every slice's commit pointer:
the truth, shared by all), so a report from any executor is right for the whole job; :func:`merged_status` merges it
into the status others write too, under a lock (files) or a resourceVersion precondition (Kubernetes), so no concurrent
update is lost and progress never goes backwards. It lives in the core because the operator, which owns assignments
and final phases, must read the status by the same rules.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipefill.queue.slices import Slice
from pipefill.spec import FillJobPhase, FillJobStatus, to_obj
from pipefill.spec.fillstatus import Assignment, OutputReport, ProfileEntry, RankBubbles, SliceProgress, UnfitReport

__all__ = [
    "FINAL_PHASES",
    "OUTPUTS_FILE",
    "Identity",
    "ProgressReport",
    "merged_status",
    "now_rfc3339",
    "output_report",
    "plan_of_record",
]

FINAL_PHASES = frozenset({FillJobPhase.SUCCEEDED.value, FillJobPhase.FAILED.value, FillJobPhase.CANCELLED.value})


@dataclass(frozen=True)
class Identity:
    """Who is asking: the PipelineTrainingJob, this pod's rank, and the training job's labels for hostSelector
    (None: not known here; the queue was filtered for this host already, as ``pipefill local`` and the operator do).
    ``pod_uid`` (``PIPEFILL_POD_UID``, from the downward API): what the operator's assignments name; None outside a
    pod, where assignments are matched by training job and rank."""

    training_job: str
    rank: int
    labels: dict[str, str] | None = None
    pod: str | None = None
    pod_uid: str | None = None


@dataclass(frozen=True)
class ProgressReport:
    """What an executor reports about a job after a commit or a phase change.

    ``committed``: units of work committed over all the job's slices; ``throughput_per_s``: the job's committed units
    per second as this executor saw them grow (all ranks' work). ``slices``: commit pointers as read from the job's
    storage (each slice's ``start, end, committed``; the truth, shared by all executors). ``unfit``: this rank lets go
    of the job, with the numbers why. ``profile``: the job's measured batch sizes. ``bubbles``: this rank's bubble
    classes."""

    phase: FillJobPhase
    committed: int
    total: int
    throughput_per_s: float | None = None
    message: str = ""
    start_time: str | None = None
    completion_time: str | None = None
    slices: tuple[SliceProgress, ...] = ()
    unfit: UnfitReport | None = None
    profile: tuple[ProfileEntry, ...] = ()
    bubbles: RankBubbles | None = None


OUTPUTS_FILE = "outputs.npy"
"""An inference job's results in its output directory, assembled once every slice is committed"""


def output_report(*, path: str, claim_name: str | None, kind: str) -> dict[str, Any]:
    """``status.output`` (camelCase, as stored): where a job's results are, written with the plan of record by
    whoever writes the plan (the operator; ``pipefill local``'s files source)."""
    files = [OUTPUTS_FILE] if kind == "inference" else []
    return to_obj(OutputReport(path=path, claim_name=claim_name, files=files))


def plan_of_record(status: dict[str, Any]) -> tuple[Slice, ...]:
    """The slices of a FillJob status (``status.slices``, camelCase as stored), in order; empty: not planned yet."""
    return tuple(sorted(Slice(int(s["start"]), int(s["end"])) for s in status.get("slices") or []))


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merged_status(
    old: dict[str, Any], report: ProgressReport, *, identity: Identity, held: Sequence[Assignment] | None
) -> dict[str, Any] | None:
    """The job's status (camelCase FillJob status fields) after this executor's ``report``, from the status as it is
    now (``old``, written by any executor and the operator); None when the report changes nothing that may change.

    * A final phase (Succeeded, Failed, Cancelled) stays: a late report of another executor does not undo it.
    * Each slice's ``committed`` of the plan of record only grows (never past its end); the plan itself (bounds) is
      never changed here, and reported slices that are not in it are ignored. ``samplesDone`` is their sum when there
      is a plan (or the report's total when larger), and never decreases.
    * ``held``: the assignments this executor holds now (files source), which replace its assignments (by training
      job and rank) and any other assignment of the same slices (a slice taken over from a dead executor); None
      leaves assignments alone (the operator owns them). A final phase clears them: nothing runs any more.
    * ``unfit`` and ``bubbleClasses``: this rank's entry (by training job and rank) is replaced, the others stay;
      ``profile`` is replaced when the report has one.
    * Queued from this executor (no batch size fits its bubbles) while others hold slices stays Running.
    * ``startTime`` is the first one reported; ``throughput`` the latest reported while running.
    """
    old_phase = old.get("phase")
    if old_phase in FINAL_PHASES and old_phase != report.phase.value:
        return None
    assignments = [Assignment(**_snake(a)) for a in old.get("assignments") or []]
    if held is not None:
        mine = {(a.start, a.end) for a in held}
        assignments = [
            a
            for a in assignments
            if (a.training_job, a.rank) != (identity.training_job, identity.rank) and (a.start, a.end) not in mine
        ]
        assignments += list(held)
    phase = report.phase
    if phase == FillJobPhase.QUEUED and assignments:
        phase = FillJobPhase.RUNNING
    if phase.value in FINAL_PHASES:
        assignments = []
    slices = _advanced(old.get("slices") or [], report.slices)
    pointers = sum(s["committed"] - s["start"] for s in slices)
    done = min(max(int(old.get("samplesDone") or 0), report.committed, pointers), report.total)
    throughput = report.throughput_per_s
    if throughput is None and phase == FillJobPhase.RUNNING:
        throughput = old.get("throughput")
    eta = None
    if throughput and phase == FillJobPhase.RUNNING:
        left_s = max(0, report.total - done) / throughput
        eta = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=left_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    decided = to_obj(
        FillJobStatus(
            phase=phase,
            assignments=sorted(assignments, key=lambda a: (a.start, a.training_job, a.rank)),
            samples_done=done,
            progress=round(100.0 * done / report.total, 3) if report.total else 0.0,
            throughput=round(throughput, 6) if throughput is not None else None,
            estimated_completion_time=eta,
            start_time=old.get("startTime") or report.start_time,
            completion_time=report.completion_time or old.get("completionTime"),
        )
    )
    # What the report decides replaces the old values (an unset optional one is removed); the rest (epoch,
    # conditions, other ranks' reports) stays as the others wrote it.
    status = {k: v for k, v in old.items() if k not in _DECIDED}
    status.update({k: v for k, v in decided.items() if k in _DECIDED})
    if slices:
        status["slices"] = slices
    here = (identity.training_job, identity.rank)
    if report.unfit is not None:
        status["unfit"] = _replaced(old.get("unfit") or [], here, to_obj(report.unfit))
    if report.bubbles is not None:
        status["bubbleClasses"] = _replaced(old.get("bubbleClasses") or [], here, to_obj(report.bubbles))
    if report.profile:
        status["profile"] = [to_obj(p) for p in sorted(report.profile, key=lambda p: p.batch_size)]
    if report.message:
        status["message"] = report.message
    return status


def _advanced(plan: list[dict[str, Any]], reported: Sequence[SliceProgress]) -> list[dict[str, Any]]:
    """The plan of record with each slice's commit pointer advanced to what was reported (never backwards)."""
    seen = {(s.start, s.end): s.committed for s in reported}
    out = []
    for s in plan:
        start, end = int(s["start"]), int(s["end"])
        committed = max(int(s.get("committed", start)), min(end, seen.get((start, end), start)))
        out.append({"start": start, "end": end, "committed": committed})
    return out


def _replaced(entries: list[dict[str, Any]], here: tuple[str, int], entry: dict[str, Any]) -> list[dict[str, Any]]:
    """``entries`` (per training job and rank) with this rank's replaced by ``entry``."""
    others = [e for e in entries if (e.get("trainingJob"), e.get("rank")) != here]
    return sorted([*others, entry], key=lambda e: (e["trainingJob"], e["rank"]))


_DECIDED = frozenset(
    {
        "phase",
        "assignments",
        "samplesDone",
        "progress",
        "throughput",
        "estimatedCompletionTime",
        "startTime",
        "completionTime",
    }
)


def _snake(assignment: dict[str, Any]) -> dict[str, Any]:
    return {
        "training_job": assignment["trainingJob"],
        "rank": assignment["rank"],
        "start": assignment["start"],
        "end": assignment["end"],
        "pod": assignment.get("pod"),
        "pod_uid": assignment.get("podUID"),
        "epoch": assignment.get("epoch"),
    }
