"""The execution planner and ``pipefill plan``: batch size and steps per bubble class, skips, multi-job assignment."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipefill.cli import main as cli_main
from pipefill.cli.units import parse_duration_s, parse_size_bytes
from pipefill.plan import (
    BubbleClass,
    JobProfile,
    ObservedBubble,
    ProfilePoint,
    assign_jobs,
    classes_from_bubbles,
    plan_class,
    plan_job,
)

GiB = 2**30
PROFILE = (ProfilePoint(16, 0.070, 5 * GiB), ProfilePoint(32, 0.130, 7 * GiB))


def test_issue_example_is_memory_bound() -> None:
    plan = plan_class(BubbleClass(0.250, 6 * GiB), PROFILE, guard_s=0.0)
    assert (plan.batch_size, plan.steps_per_bubble, plan.samples_per_bubble) == (16, 3, 48)
    assert plan.bubbles_needed(1000) == 21


def test_more_memory_picks_the_larger_batch() -> None:
    plan = plan_class(BubbleClass(0.250, 8 * GiB), PROFILE, guard_s=0.0)
    assert (plan.batch_size, plan.steps_per_bubble, plan.samples_per_bubble) == (16, 3, 48)  # 48 > 32 × 1
    plan = plan_class(BubbleClass(0.270, 8 * GiB), PROFILE, guard_s=0.0)
    assert (plan.batch_size, plan.steps_per_bubble) == (32, 2)  # 64 > 48


def test_time_bound_guard_switch_and_transfer_cost_steps() -> None:
    bubble = BubbleClass(0.250, 6 * GiB)
    assert plan_class(bubble, PROFILE, guard_s=0.041).steps_per_bubble == 2
    assert plan_class(bubble, PROFILE, guard_s=0.02, switch_s=0.021).steps_per_bubble == 2
    assert plan_class(bubble, PROFILE, guard_s=0.0, transfer_s=0.05).steps_per_bubble == 2
    exact = plan_class(BubbleClass(0.3, 6 * GiB), (ProfilePoint(1, 0.1, 0),), guard_s=0.0)
    assert exact.steps_per_bubble == 3  # 0.3 / 0.1 must not round down to 2


def test_margin_makes_it_memory_bound() -> None:
    plan = plan_class(BubbleClass(0.250, 6 * GiB), PROFILE, guard_s=0.0, margin_bytes=GiB + 1)
    assert not plan.usable and plan.reason.startswith("memory:")


@pytest.mark.parametrize(
    ("bubble", "kwargs", "reason"),
    [
        (BubbleClass(0.060, 6 * GiB), {}, "time:"),
        (BubbleClass(0.250, 4 * GiB), {}, "memory:"),
        (BubbleClass(0.004, 8 * GiB), {"min_bubble_s": 0.005}, "bubble 4 ms is shorter"),
    ],
)
def test_nothing_fits(bubble: BubbleClass, kwargs: dict[str, float], reason: str) -> None:
    plan = plan_class(bubble, PROFILE, guard_s=0.0, **kwargs)
    assert not plan.usable and plan.samples_per_bubble == 0 and plan.bubbles_needed(10) is None
    assert plan.reason.startswith(reason)


def test_several_classes_and_training_steps_needed() -> None:
    classes = [BubbleClass(0.250, 6 * GiB), BubbleClass(0.080, 6 * GiB, count_per_step=2), BubbleClass(0.01, 6 * GiB)]
    job = plan_job(classes, PROFILE, total_samples=1000, guard_s=0.0)
    assert [p.samples_per_bubble for p in job.classes] == [48, 16, 0]
    assert job.samples_per_training_step == 48 + 2 * 16
    assert job.training_steps_needed == 13  # ceil(1000 / 80)
    out = job.to_dict()
    assert [c["bubbles_needed"] for c in out["classes"]] == [21, 63, None]
    assert "skipped" in out["classes"][2]


def test_multi_job_long_bubbles_to_training_short_to_inference() -> None:
    train = JobProfile("train", (ProfilePoint(64, 0.100, 3 * GiB),), kind="training")
    infer = JobProfile("infer", (ProfilePoint(8, 0.010, GiB),))
    classes = [BubbleClass(0.250, 6 * GiB), BubbleClass(0.040, 6 * GiB, count_per_step=2)]
    got = {a.bubble.duration_s: a.job for a in assign_jobs(classes, [train, infer], guard_s=0.001)}
    assert got == {0.250: "train", 0.040: "infer"}


def test_multi_job_priority_takes_all_it_can_use() -> None:
    train = JobProfile("train", (ProfilePoint(64, 0.100, 3 * GiB),), priority=5)
    infer = JobProfile("infer", (ProfilePoint(8, 0.010, GiB),))
    classes = [BubbleClass(0.250, 6 * GiB), BubbleClass(0.040, 6 * GiB), BubbleClass(0.500, 2 * GiB)]
    got = [a.job for a in assign_jobs(classes, [infer, train], guard_s=0.0)]
    assert got == ["train", "infer", "infer"]  # train cannot use 40 ms, nor 2 GiB


def test_multi_job_nothing_fits_leaves_class_empty() -> None:
    jobs = [JobProfile("a", PROFILE), JobProfile("b", (ProfilePoint(1, 0.5, 0),))]
    (only,) = assign_jobs([BubbleClass(0.02, 8 * GiB)], jobs, guard_s=0.0)
    assert only.job is None and only.plan is None and set(only.candidates) == {"a", "b"}


def test_classes_from_observed_bubbles() -> None:
    seen = [ObservedBubble(d, f, "p2p") for d, f in [(0.100, 6 * GiB), (0.104, 5 * GiB), (0.098, 6 * GiB)]]
    seen += [ObservedBubble(0.020, 7 * GiB, "tail")] * 2
    classes = classes_from_bubbles(seen, training_steps=2)
    assert [(c.duration_s, c.free_bytes, c.count_per_step, c.name) for c in classes] == [
        (0.098, 5 * GiB, 1.5, "p2p"),
        (0.020, 7 * GiB, 1.0, "tail"),
    ]


def test_units() -> None:
    assert parse_duration_s("250ms") == pytest.approx(0.25)
    assert parse_duration_s("0.25s") == pytest.approx(0.25)
    assert parse_duration_s("1.5ms") == pytest.approx(0.0015)
    assert parse_size_bytes("6GiB") == parse_size_bytes("6Gi") == 6 * GiB
    assert parse_size_bytes("512MiB") == 512 * 2**20
    assert parse_size_bytes("4096") == parse_size_bytes("4096B") == 4096
    with pytest.raises(ValueError, match=r"--bubble: invalid duration '250'.*250ms"):
        parse_duration_s("250", field="--bubble")
    with pytest.raises(ValueError, match=r"--margin: invalid size '6 gigs'.*6GiB"):
        parse_size_bytes("6 gigs", field="--margin")


def test_cli_json_matches_issue(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--bubble", "250ms:6GiB", "--profile", "16:70ms:5GiB", "--profile", "32:130ms:7GiB"]
    assert cli_main([*argv, "--samples", "1000", "--guard", "0ms", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {k: out[k] for k in ("batch_size", "steps_per_bubble", "samples_per_bubble", "bubbles_needed")} == {
        "batch_size": 16,
        "steps_per_bubble": 3,
        "samples_per_bubble": 48,
        "bubbles_needed": 21,
    }
    assert cli_main([*argv, "--bubble", "40ms:8GiB:2", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["classes"]) == 2


def test_cli_bad_input_names_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["plan", "--bubble", "250ms", "--profile", "16:70ms:5GiB"]) == 2
    err = capsys.readouterr().err
    assert "--bubble" in err and "'250ms'" in err and "DURATION:FREE" in err
    assert cli_main(["plan", "--bubble", "250ms:6GiB", "--profile", "16:70:5GiB"]) == 2
    assert "--profile: invalid duration '70'" in capsys.readouterr().err


def test_cli_entry_point_table() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipefill", "plan", "--bubble", "250ms:6GiB", "--profile", "16:70ms:5GiB"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "250ms:6GiB" in proc.stdout and "16" in proc.stdout


def test_classes_from_the_timeline_simulator() -> None:
    from pipefill.schedules import Costs, build_schedule, simulate

    schedule = build_schedule("1f1b", ranks=4, microbatches=8)
    costs = Costs(f_s=(0.010,), b_s=(0.020,), i_s=(0.010,), w_s=(0.010,))
    timeline = simulate(schedule, costs)
    classes = classes_from_bubbles(timeline.bubbles(0), default_free_bytes=GiB)
    assert classes and all(c.free_bytes == GiB for c in classes)
    offered = sum(c.count_per_step * c.duration_s for c in classes)
    assert offered == pytest.approx(timeline.idle_s(0), rel=0.2)  # planned lengths are low quantiles of the members
    plan = plan_job(classes, PROFILE[:1], total_samples=100, guard_s=0.0)
    assert len(plan.classes) == len(classes)
