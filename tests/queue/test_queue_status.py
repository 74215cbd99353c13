"""The status merge rules (pipefill.queue.merged_status), the one place both the executors and the operator read
them: assignments held, commit pointers that never go back, per-rank unfit and bubble-class reports, the profile,
final phases."""

from __future__ import annotations

from pipefill.queue import FillJobPhase, Identity, ProgressReport, merged_status, plan_of_record
from pipefill.queue.slices import Slice
from pipefill.spec import fillstatus as fs

ME, OTHER = Identity("gpt", 0), Identity("gpt", 1)
PLAN = [{"start": 0, "end": 50, "committed": 0}, {"start": 50, "end": 100, "committed": 50}]


def _held(who: Identity, *slices: tuple[int, int], epoch: int = 1) -> list[fs.Assignment]:
    return [fs.Assignment(who.training_job, who.rank, a, b, epoch=epoch) for a, b in slices]


def test_assignments_held_and_final_phases() -> None:
    running = ProgressReport(FillJobPhase.RUNNING, committed=50, total=100, start_time="2026-01-01T00:00:00Z")
    first = merged_status({}, running, identity=OTHER, held=_held(OTHER, (0, 50)))
    assert first is not None and first["samplesDone"] == 50
    older = ProgressReport(FillJobPhase.RUNNING, committed=40, total=100, start_time="2026-02-02T00:00:00Z")
    second = merged_status(first, older, identity=ME, held=_held(ME, (50, 100)))
    assert second is not None and second["samplesDone"] == 50 and second["startTime"] == "2026-01-01T00:00:00Z"
    assert [(a["rank"], a["start"]) for a in second["assignments"]] == [(1, 0), (0, 50)]
    takeover = merged_status(second, running, identity=ME, held=_held(ME, (0, 50), epoch=2))  # rank 1 died
    assert takeover is not None and [(a["rank"], a["start"], a["epoch"]) for a in takeover["assignments"]] == [
        (0, 0, 2)
    ]
    queued = ProgressReport(FillJobPhase.QUEUED, committed=50, total=100, message="nothing fits")
    still = merged_status(second, queued, identity=ME, held=[])
    assert still is not None and still["phase"] == "Running" and still["message"] == "nothing fits"
    done = merged_status(second, ProgressReport(FillJobPhase.SUCCEEDED, committed=100, total=100), identity=ME, held=[])
    assert done is not None and done["phase"] == "Succeeded" and done["assignments"] == []
    assert merged_status(done, running, identity=OTHER, held=_held(OTHER, (0, 50))) is None  # a final phase stays


def test_commit_pointers_only_advance_within_the_plan() -> None:
    old = {"phase": "Running", "slices": PLAN, "samplesDone": 0}
    ahead = ProgressReport(
        FillJobPhase.RUNNING,
        0,
        100,
        slices=(fs.SliceProgress(0, 50, 30), fs.SliceProgress(50, 100, 70), fs.SliceProgress(0, 10, 10)),
    )
    new = merged_status(old, ahead, identity=ME, held=None)
    assert new is not None and new["slices"] == [
        {"start": 0, "end": 50, "committed": 30},
        {"start": 50, "end": 100, "committed": 70},
    ]  # [0, 10) is not in the plan of record: ignored; the bounds never change
    assert new["samplesDone"] == 50 and new["progress"] == 50.0
    behind = ProgressReport(FillJobPhase.RUNNING, 0, 100, slices=(fs.SliceProgress(0, 50, 10),))  # read before a commit
    again = merged_status(new, behind, identity=OTHER, held=None)
    assert again is not None and again["slices"] == new["slices"] and again["samplesDone"] == 50
    assert plan_of_record(again) == (Slice(0, 50), Slice(50, 100)) and plan_of_record({}) == ()


def test_unfit_profile_and_bubble_classes_per_rank() -> None:
    mine = fs.UnfitReport(
        "gpt", 0, fs.UnfitReason.BUBBLE_TOO_SHORT, "no bubble long enough", 2.5, 4.0, 1 << 30, 1 << 20
    )
    theirs = {"trainingJob": "gpt", "rank": 1, "reason": "NotEnoughMemory", "message": "x"}
    old = {"phase": "Running", "unfit": [theirs], "bubbleClasses": [{"trainingJob": "gpt", "rank": 0, "classes": []}]}
    profile = (fs.ProfileEntry(8, 4.0, 2 << 20), fs.ProfileEntry(1, 1.5, 1 << 20))
    bubbles = fs.RankBubbles("gpt", 0, [fs.BubbleClassReport(2.5, 4.0, 1 << 30)])
    report = ProgressReport(FillJobPhase.QUEUED, 0, 100, unfit=mine, profile=profile, bubbles=bubbles)
    new = merged_status(old, report, identity=ME, held=None)
    assert new is not None
    assert new["unfit"] == [
        {
            "trainingJob": "gpt",
            "rank": 0,
            "reason": "BubbleTooShort",
            "message": "no bubble long enough",
            "longestBubbleMilliseconds": 2.5,
            "stepMilliseconds": 4.0,
            "freeBytes": 1 << 30,
            "peakMemoryBytes": 1 << 20,
        },
        theirs,
    ]
    assert [p["batchSize"] for p in new["profile"]] == [1, 8]
    assert new["bubbleClasses"] == [
        {
            "trainingJob": "gpt",
            "rank": 0,
            "classes": [{"durationMilliseconds": 2.5, "perStep": 4.0, "freeBytes": 1 << 30}],
        }
    ]
    plain = merged_status(new, ProgressReport(FillJobPhase.RUNNING, 0, 100), identity=OTHER, held=None)
    assert plain is not None and plain["unfit"] == new["unfit"] and plain["profile"] == new["profile"]  # kept
