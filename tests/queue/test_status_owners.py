"""Every part of FillJob status has one writer (pipefill.spec.fillstatus.STATUS_WRITERS), and both writers keep to it:
the queue's patches (pipefill.queue.outcome.decide) and the executors' (pipefill.queue.status.executor_patch) are
checked against the table where they are made, and the docs carry the table as the code has it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from pipefill.queue import FillJobPhase, Identity, JobOutcome, Placement, ProgressReport, SliceStatus
from pipefill.queue.outcome import decide
from pipefill.queue.status import check_patch, executor_patch
from pipefill.spec import FillJobStatus
from pipefill.spec._schema import json_name
from pipefill.spec.fillstatus import (
    STATUS_WRITERS,
    BubbleClassReport,
    ProfileEntry,
    RankBubbles,
    SliceProgress,
    UnfitReason,
    UnfitReport,
    Writer,
)

ROOT = Path(__file__).resolve().parents[2]
NOW = "2026-01-01T00:00:00Z"
ME = Identity("train", 0)
PLAN = [{"start": 0, "end": 64, "committed": 0}, {"start": 64, "end": 128, "committed": 64}]
FILL = {
    "metadata": {"namespace": "ns", "name": "embed"},
    "spec": {"workload": {"kind": "inference"}, "output": {"path": "out"}, "totalSamples": 128},
}


def _writers(path: str) -> set[Writer]:
    return {w.writer for w in STATUS_WRITERS if w.path == path}


def test_every_status_field_and_shared_sub_field_has_exactly_one_writer_per_phase() -> None:
    fields = {json_name(f) for f in dataclasses.fields(FillJobStatus)}
    assert {w.path.split("[")[0] for w in STATUS_WRITERS} == fields
    for path in {w.path for w in STATUS_WRITERS}:
        rows = [w for w in STATUS_WRITERS if w.path == path]
        if len(rows) > 1:  # shared by phase: the phases split between the writers, none left out
            assert all(r.phases for r in rows) and not set.intersection(*(set(r.phases) for r in rows)), path
            assert set().union(*(r.phases for r in rows)) == {p.value for p in FillJobPhase}, path
    # a list two parties share: each sub-field one writer
    assert _writers("slices[].start") == _writers("slices[].end") == {Writer.QUEUE}
    assert _writers("slices[].committed") == {Writer.EXECUTOR}


def _outcome(**kw: Any) -> JobOutcome:
    base: dict[str, Any] = dict(
        namespace="ns", name="embed", slices=(SliceStatus(0, 64, 0), SliceStatus(64, 128, 64)), planned=False,
        assignments=(), new=(), released=(), epoch=0, reason="", code="",
    )  # fmt: skip
    base.update(kw)
    return JobOutcome(**base)


def _body(status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {**FILL, "spec": {**FILL["spec"], **spec}, "status": status}


PLACED = Placement("embed", 0, 64, "train", 0, "train-0", "u0", 1)


@pytest.mark.parametrize(
    ("status", "outcome", "spec"),
    [
        ({}, _outcome(planned=True, assignments=(PLACED,), new=(PLACED,), epoch=1), {}),
        ({"slices": PLAN, "phase": "Running"}, _outcome(code="NoFreeRank", reason="every rank is full"), {}),
        ({"slices": [dict(s, committed=s["end"]) for s in PLAN], "phase": "Running"}, _outcome(assignments=(PLACED,), epoch=1), {}),
        ({"slices": PLAN, "phase": "Running", "assignments": []}, _outcome(), {"cancel": True}),
        ({"slices": PLAN, "phase": "Running", "unfit": [{"trainingJob": "gone", "rank": 0}]}, _outcome(), {"suspend": True}),
        ({"slices": PLAN, "phase": "Succeeded", "assignments": [{"start": 0}]}, _outcome(), {}),
    ],
)  # fmt: skip
def test_the_queues_patches_write_only_its_part(
    status: dict[str, Any], outcome: JobOutcome, spec: dict[str, Any]
) -> None:
    patch = decide(_body(status, **spec), outcome, running_hosts=set(), now=NOW).patch
    assert patch is not None
    check_patch(Writer.QUEUE, status, patch)  # decide checked it already; this says the table allows each write


def _report(phase: FillJobPhase, committed: tuple[int, int], **kw: Any) -> ProgressReport:
    pointers = (SliceProgress(0, 64, committed[0]), SliceProgress(64, 128, committed[1]))
    return ProgressReport(
        phase, sum(c - s for c, s in zip(committed, (0, 64), strict=True)), 128, slices=pointers, **kw
    )


def test_the_executors_patches_write_only_its_part_and_leave_the_queues_alone() -> None:
    old = {"slices": PLAN, "phase": "Running", "message": "2 slices on train/0", "startTime": NOW}
    unfit = UnfitReport("train", 0, UnfitReason.BUBBLE_TOO_SHORT, "no batch fits 2 ms")
    bubbles = RankBubbles("train", 0, [BubbleClassReport(2.0, 4.0, 1 << 20)], 10.0)
    running = _report(
        FillJobPhase.QUEUED, (32, 64), message="rank 0 lets go", start_time="2027-01-01T00:00:00Z", throughput_per_s=3.0
    )
    patch = executor_patch(
        old,
        [dataclasses.replace(running, unfit=unfit, bubbles=bubbles, profile=(ProfileEntry(1, 1.0, 1),))],
        identity=ME,
    )
    assert patch is not None
    # its commit pointer, its rank's reports, the profile, the throughput; not the phase, words or times of the queue
    assert set(patch) == {"slices", "unfit", "bubbleClasses", "profile", "throughput"}
    assert [s["committed"] for s in patch["slices"]] == [32, 64]
    verdict = executor_patch({**old, **patch}, [_report(FillJobPhase.FAILED, (32, 64), message="boom")], identity=ME)
    assert verdict is not None and verdict["phase"] == "Failed" and verdict["message"] == "boom"
    assert "samplesDone" not in verdict and "startTime" not in verdict  # the queue's, from the pointers


@pytest.mark.parametrize(
    ("writer", "old", "patch", "says"),
    [
        (Writer.EXECUTOR, {}, {"assignments": []}, "status.assignments: written by the executor"),
        (Writer.EXECUTOR, {}, {"phase": "Running"}, "status.phase: written by the executor (phase Running)"),
        (Writer.QUEUE, {}, {"phase": "Succeeded"}, "the executor (Failed/Succeeded)"),
        (Writer.QUEUE, {"slices": PLAN}, {"slices": PLAN}, "rewrote the plan of record"),
        (Writer.EXECUTOR, {"slices": PLAN}, {"slices": [dict(PLAN[0], end=60), PLAN[1]]}, "changed the plan's bounds"),
        (Writer.EXECUTOR, {"slices": [dict(PLAN[0], committed=9), PLAN[1]]}, {"slices": PLAN}, "moved a commit pointer back"),
        (Writer.EXECUTOR, {}, {"unfit": [{"trainingJob": "train", "rank": 1}]}, "changed another rank's entry"),
        (Writer.QUEUE, {}, {"unfit": [{"trainingJob": "train", "rank": 1}]}, "added an entry"),
    ],
)  # fmt: skip
def test_a_write_of_another_partys_part_is_refused_naming_the_field_and_its_owner(
    writer: Writer, old: dict[str, Any], patch: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        check_patch(writer, old, patch, rank=("train", 0))


def render_table() -> str:
    """The ownership table as docs/fill.md carries it."""
    lines = ["| status field | written by | when | what |", "|---|---|---|---|"]
    for w in STATUS_WRITERS:
        when = ", ".join(sorted(w.phases)) if w.phases else "always"
        lines.append(f"| `{w.path}` | {w.writer} | {when} | {w.why} |")
    return "\n".join(lines)


def test_the_docs_carry_the_table_as_the_code_has_it() -> None:
    assert render_table() in (ROOT / "docs" / "fill.md").read_text(), "docs/fill.md: paste render_table()'s table"
