"""The slice plan of record is one (the fill image uses the core's), and the bulk planner agrees with plan_class."""

from __future__ import annotations

import random

import pytest

import pipefill_fill.slices as fill_slices
import pipefill_fill.sources.base as fill_sources
import pipefill_fill.sources.files as files_source
import pipefill_fill.work as fill_work
from pipefill import queue
from pipefill.plan import BubbleClass, ProfilePoint, plan_class, samples_per_bubble
from pipefill.queue import Slice, check_plan, plan_slices


def test_the_fill_image_uses_the_cores_plan_and_status_merge() -> None:
    assert fill_work.Slice is queue.Slice and files_source.plan_slices is queue.plan_slices  # the local "operator"
    assert not hasattr(fill_slices, "plan_slices") and not hasattr(fill_work, "plan_slices")  # executors never plan
    assert fill_sources.merged_status is queue.merged_status and fill_sources.ProgressReport is queue.ProgressReport


def test_check_plan_accepts_the_plan_and_refuses_gaps() -> None:
    for total, ranks in ((100, 1), (4096, 3), (10**9, 16)):
        check_plan(plan_slices(total, parallel_ranks=ranks), total=total)
    with pytest.raises(ValueError, match=r"slices \[0, 10\) and \[20, 30\) leave a gap or overlap"):
        check_plan([Slice(0, 10), Slice(20, 30)], total=30)
    with pytest.raises(ValueError, match="empty plan"):
        check_plan([], total=5)


def test_samples_per_bubble_agrees_with_plan_class() -> None:
    rng = random.Random(11)
    for _ in range(400):
        classes = [
            BubbleClass(rng.uniform(0, 0.3), rng.randrange(0, 8 << 30), rng.choice((1.0, 3.0)))
            for _ in range(rng.randrange(1, 5))
        ]
        profile = [
            ProfilePoint(b, rng.uniform(0.001, 0.2), rng.randrange(0, 8 << 30), rng.choice((None, 1)))
            for b in rng.sample((1, 2, 4, 8, 16, 32), rng.randrange(1, 6))
        ]
        guard_s = rng.choice((0.0, 0.001, 0.01))
        expected = [plan_class(c, profile, guard_s=guard_s).samples_per_bubble for c in classes]
        assert samples_per_bubble(classes, profile, guard_s=guard_s) == expected
    exact = BubbleClass(0.3, 1 << 30)  # 0.3 / 0.1 is 2.9999999999999996: both plan 3 steps
    assert samples_per_bubble([exact], [ProfilePoint(1, 0.1, 0)], guard_s=0.0) == [3]


def test_plan_never_exceeds_the_status_bound() -> None:
    assert len(plan_slices(10**12, parallel_ranks=65536)) == queue.MAX_SLICES


def test_an_executor_report_keeps_what_the_operator_wrote() -> None:
    """merged_status replaces only what a progress report decides: the plan of record, the epochs and the
    operator's conditions stay, and assignments keep their pods and epochs."""
    old = {
        "phase": "Running",
        "slices": [{"start": 0, "end": 10, "committed": 4}],
        "epoch": 7,
        "conditions": [{"type": "Scheduled", "status": "True", "reason": "Assigned"}],
        "throughput": 5.0,
        "assignments": [
            {"trainingJob": "gpt", "rank": 1, "start": 0, "end": 10, "pod": "gpt-0-1", "podUID": "u1", "epoch": 7}
        ],
    }
    report = queue.ProgressReport(queue.FillJobPhase.RUNNING, committed=4, total=10, throughput_per_s=None)
    new = queue.merged_status(old, report, identity=queue.Identity("gpt", 1), held=None)
    assert new is not None
    assert new["slices"] == old["slices"] and new["epoch"] == 7 and new["conditions"] == old["conditions"]
    assert new["assignments"] == old["assignments"] and new["samplesDone"] == 4
    done = queue.ProgressReport(queue.FillJobPhase.SUCCEEDED, committed=10, total=10)
    final = queue.merged_status(old, done, identity=queue.Identity("gpt", 1), held=None)
    assert final is not None and final["assignments"] == [] and "throughput" not in final


def test_max_active_jobs_is_one_setting() -> None:
    from pipefill import env

    assert env.fill_max_active_jobs({}) == env.DEFAULT_FILL_MAX_ACTIVE_JOBS
    assert env.fill_max_active_jobs({env.FILL_MAX_ACTIVE_JOBS: "3"}) == 3
    with pytest.raises(ValueError, match="PIPEFILL_FILL_MAX_ACTIVE_JOBS=0 must be ≥ 1"):
        env.fill_max_active_jobs({env.FILL_MAX_ACTIVE_JOBS: "0"})
