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
from pipefill.spec.fillstatus import (
    STATUS_WRITERS,
    Assignment,
    OutputReport,
    ProfileEntry,
    RankBubbles,
    SliceProgress,
    UnfitReport,
    Writer,
)

__all__ = [
    "EXECUTOR_FIELDS",
    "FINAL_PHASES",
    "OUTPUTS_FILE",
    "QUEUE_MARKER",
    "Identity",
    "ProgressReport",
    "check_patch",
    "executor_patch",
    "merged_status",
    "now_rfc3339",
    "output_report",
    "plan_of_record",
]

FINAL_PHASES = frozenset({FillJobPhase.SUCCEEDED.value, FillJobPhase.FAILED.value, FillJobPhase.CANCELLED.value})
QUEUE_MARKER = "queue.json"
"""In a ``files:`` work directory: a queue (``pipefill local``'s) writes the assignments; the executors follow them"""
EXECUTOR_FIELDS = tuple(dict.fromkeys(w.path.split("[")[0] for w in STATUS_WRITERS if w.writer == Writer.EXECUTOR))
"""The status fields an executor's report may write (:data:`pipefill.spec.fillstatus.STATUS_WRITERS`)."""


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


def executor_patch(
    old: dict[str, Any], reports: Sequence[ProgressReport], *, identity: Identity
) -> dict[str, Any] | None:
    """What an executor writes of ``reports`` (in order) into the status ``old``: the parts of it that changed and that
    :data:`~pipefill.spec.fillstatus.STATUS_WRITERS` gives the executor (None removes a field, as in a merge patch);
    None when nothing changed. Whoever applies it (the kubernetes source as a merge patch, the files source under a
    queue into the status file) writes nothing else."""
    merged = old
    for report in reports:
        merged = merged_status(merged, report, identity=identity, held=None) or merged
    changed = {k: merged.get(k) for k in EXECUTOR_FIELDS if merged.get(k) != old.get(k)}
    phase = str(changed.get("phase") or old.get("phase") or FillJobPhase.QUEUED.value)
    for key in [k for k in changed if not _writes(Writer.EXECUTOR, k, phase)]:
        del changed[key]  # Queued and Running, and their words, are the queue's (assignments decide them)
    if not changed:
        return None
    check_patch(Writer.EXECUTOR, old, changed, rank=(identity.training_job, identity.rank))
    return changed


def _writes(writer: Writer, key: str, phase: str) -> bool:
    return any(
        w.writer == writer and w.path.split("[")[0] == key and (not w.phases or phase in w.phases)
        for w in STATUS_WRITERS
    )


def check_patch(
    writer: Writer, old: dict[str, Any], patch: dict[str, Any], *, rank: tuple[str, int] | None = None
) -> None:
    """Refuse (ValueError, naming the field, the writer and the owner) a ``patch`` of status ``old`` that writes what
    :data:`~pipefill.spec.fillstatus.STATUS_WRITERS` does not give ``writer``: a field of the other party, a phase of
    the other's, the plan's bounds after it was written, another rank's report entry (``rank``: the executor's
    (training job, rank)), an unfit entry the queue did not only remove."""
    phase = str(patch.get("phase") or old.get("phase") or FillJobPhase.QUEUED.value)
    for key, value in patch.items():
        rows = [w for w in STATUS_WRITERS if w.path.split("[")[0] == key]
        mine = {w.path for w in rows if w.writer == writer and (not w.phases or phase in w.phases)}
        if not mine:
            owners = ", ".join(
                f"the {w.writer}" + (f" ({'/'.join(sorted(w.phases))})" if w.phases else "") for w in rows
            )
            raise ValueError(
                f"status.{key}: written by the {writer} (phase {phase}), but STATUS_WRITERS gives it to "
                f"{owners or 'no one'}; write only your own fields, or give the field a row in the table"
            )
        why = _sub_field_problem(key, mine, old.get(key) or [], value or [], rank)
        if why:
            raise ValueError(f"status.{key}: the {writer} {why} (STATUS_WRITERS); write only your own part")


def _sub_field_problem(
    key: str, mine: set[str], old: list[dict[str, Any]], new: list[dict[str, Any]], rank: tuple[str, int] | None
) -> str:
    """Why a write of the list ``key`` touches a part of it ``mine`` (the table's paths for the writer) leaves out."""
    if key == "slices" and "slices[]" in mine:
        return "rewrote the plan of record, which is written once" if old else ""
    if key == "slices":
        if [(s["start"], s["end"]) for s in old] != [(s["start"], s["end"]) for s in new]:
            return "changed the plan's bounds (start, end)"
        moved_back = any(int(n["committed"]) < int(o["committed"]) for o, n in zip(old, new, strict=True))
        return "moved a commit pointer back" if moved_back else ""
    if f"{key}[]" in mine:

        def others(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [e for e in entries if (e.get("trainingJob"), e.get("rank")) != rank]

        return "changed another rank's entry" if rank is None or others(old) != others(new) else ""
    if key == "unfit" and any(e not in old for e in new):
        return "added an entry (only its rank's executor does; the queue only removes them)"
    return ""


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
    {"phase", "assignments", "samplesDone", "progress", "throughput", "estimatedCompletionTime", "startTime"}
    | {"completionTime"}
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
