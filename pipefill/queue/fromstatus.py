"""What one scheduling pass reads from FillJob status (camelCase, as stored): the plan with its commit pointers, the
unfit reports, the measured profile, the assignments, and the bubble classes the executors reported per rank.

The operator reads them from the FillJobs its cache holds, ``pipefill local`` from the status files in its work
directory: one reading, so a pass decides alike on both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pipefill.plan import BubbleClass, ProfilePoint
from pipefill.queue.snapshot import Placement, SliceStatus, Unfit

__all__ = ["RankBubbles", "reported_bubbles", "status_fields"]

RankBubbles = dict[tuple[str, str, int], tuple[tuple[BubbleClass, ...], float | None]]
"""(namespace, training job, rank) -> (its bubble classes, its measured step time in seconds or None)"""


def status_fields(name: str, status: dict[str, Any]) -> dict[str, Any]:
    """The queue's view of what the operator and the executors wrote into FillJob ``name``'s status: the keyword
    arguments of :meth:`~pipefill.queue.FillJobView.from_spec` beyond the spec (``phase`` and ``epoch`` aside)."""
    return {
        "slices": tuple(
            SliceStatus(int(s["start"]), int(s["end"]), int(s["committed"])) for s in status.get("slices") or ()
        ),
        "unfit": tuple(
            Unfit(u["trainingJob"], int(u["rank"]), str(u.get("message") or u.get("reason") or ""))
            for u in status.get("unfit") or ()
        ),
        "profile": tuple(
            ProfilePoint(int(p["batchSize"]), float(p["stepMilliseconds"]) / 1e3, int(p["peakMemoryBytes"]))
            for p in status.get("profile") or ()
        ),
        "assignments": tuple(
            Placement(
                name,
                int(a["start"]),
                int(a["end"]),
                str(a["trainingJob"]),
                int(a["rank"]),
                str(a.get("pod") or ""),
                str(a.get("podUID") or ""),
                int(a.get("epoch") or 0),
            )
            for a in status.get("assignments") or ()
        ),
    }


def reported_bubbles(statuses: Iterable[tuple[str, dict[str, Any]]]) -> RankBubbles:
    """Bubble classes per (namespace, training job, rank) as executors reported them in the ``(namespace, status)``
    of FillJobs, in the order given (the first with a report wins, so give them by name: the choice is then
    deterministic)."""
    out: RankBubbles = {}
    for namespace, status in statuses:
        for entry in status.get("bubbleClasses") or ():
            try:
                key = (namespace, str(entry["trainingJob"]), int(entry["rank"]))
                if key in out or not entry.get("classes"):
                    continue
                classes = tuple(
                    BubbleClass(float(c["durationMilliseconds"]) / 1e3, int(c["freeBytes"]), float(c["perStep"]))
                    for c in entry["classes"]
                )
                step_ms = entry.get("stepMilliseconds")
                out[key] = (classes, float(step_ms) / 1e3 if step_ms else None)
            except (KeyError, TypeError, ValueError):
                continue
    return out
