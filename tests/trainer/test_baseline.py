"""The no-fill baseline over a real bubble channel (producer and consumer in this process): which steps are quiet,
which count, under which source, and the median the trainer exports."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from pipefill.channel import Consumer, Producer, hold_fill
from pipefill.schedules.model import Action, Kind
from pipefill_trainer.baseline import NoFillSteps
from pipefill_trainer.instrument import BubbleAnnouncer, Slot
from pipefill_trainer.metrics import TrainerMetrics


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.mark.parametrize("said", [True, False], ids=["quiet-said", "quiet-unsaid"])
def test_quiet_and_held_steps_count_unless_the_fill_worked_in_them(tmp_path: Path, said: bool) -> None:
    """The same outcomes whether ``begin`` is told the step is quiet (it then skips the answer block of a step that
    cannot count) or not."""
    registry = CollectorRegistry()
    metrics = TrainerMetrics(registry)
    assert math.isnan(_value(registry, "pipefill_trainer_baseline_step_seconds") or 0.0)
    producer = Producer.create(channel_dir=tmp_path)
    consumer = Consumer.attach(channel_dir=tmp_path, timeout_s=5)

    def fill_works_in_a_bubble() -> None:
        bubble = producer.open_bubble(expected_duration_s=0.01, free_bytes=1, kind="steady", step=0, mb_idx=0)
        got = consumer.wait_bubble(1.0)
        assert got is not None and got.id == bubble
        consumer.acknowledge(bubble, used_s=0.005, work=1)
        producer.close_bubble(bubble)

    try:
        steps = NoFillSteps(metrics, producer=producer, channel_dir=tmp_path, every_steps=4)

        def told(quiet: bool) -> bool | None:
            return quiet if said else None

        assert [s for s in range(12) if steps.quiet(s)] == [3, 7, 11]  # the same step numbers on every rank
        steps.begin(quiet=told(False))  # the warm-up and profiling steps: no bubble announced, but never counted
        assert steps.end(step_s=9.0, profiling=True, quiet=False) is None
        steps.begin(quiet=told(False))  # a normal step, fill running
        fill_works_in_a_bubble()
        assert steps.end(step_s=0.40, profiling=False, quiet=False) is None
        steps.begin(quiet=told(True))  # a quiet step, nothing filled
        assert steps.end(step_s=0.30, profiling=False, quiet=True) == "quiet"
        steps.begin(quiet=told(True))  # a quiet step into which the bubble before overran
        fill_works_in_a_bubble()
        assert steps.end(step_s=0.41, profiling=False, quiet=True) is None
        hold_fill(tmp_path, True)
        steps.begin(quiet=told(False))  # held, but the fill took one more bubble and worked in it
        fill_works_in_a_bubble()
        assert steps.end(step_s=0.45, profiling=False, quiet=False) is None
        steps.begin(quiet=told(False))  # held all step long, no fill work
        assert steps.end(step_s=0.34, profiling=False, quiet=False) == "held"
        hold_fill(tmp_path, False)
        steps.begin(quiet=told(False))  # released during the step
        hold_fill(tmp_path, True)
        assert steps.end(step_s=0.50, profiling=False, quiet=False) is None
    finally:
        consumer.close()
        producer.close()
    assert steps.baseline_s == pytest.approx(0.32)  # median of 0.30 and 0.34
    assert _value(registry, "pipefill_trainer_baseline_step_seconds") == pytest.approx(0.32)
    assert _value(registry, "pipefill_trainer_baseline_steps_total", source="quiet") == 1
    assert _value(registry, "pipefill_trainer_baseline_steps_total", source="held") == 1
    assert _value(registry, "pipefill_trainer_baseline_steps_total", source="no-fill") == 0


def test_a_step_that_cannot_count_leaves_the_answer_block_unread(tmp_path: Path) -> None:
    """Neither quiet nor held when it begins, a step cannot count: its two reads of the fill's answer block are
    skipped. A quiet one, or one begun held, reads it at both ends."""
    producer = Producer.create(channel_dir=tmp_path)

    class Counted:
        reads = 0

        def fill_answer(self) -> object:
            Counted.reads += 1
            return producer.fill_answer()

    try:
        steps = NoFillSteps(
            TrainerMetrics(CollectorRegistry()), producer=Counted(), channel_dir=tmp_path, every_steps=4
        )
        steps.begin(quiet=False)
        assert steps.end(step_s=0.4, profiling=False, quiet=False) is None
        assert Counted.reads == 0
        steps.begin(quiet=True)
        assert steps.end(step_s=0.3, profiling=False, quiet=True) == "quiet"
        assert Counted.reads == 2
        hold_fill(tmp_path, True)
        steps.begin(quiet=False)
        assert steps.end(step_s=0.35, profiling=False, quiet=False) == "held"
        assert Counted.reads == 4
    finally:
        producer.close()


def test_without_fill_every_step_after_the_profile_counts_and_none_is_quiet() -> None:
    registry = CollectorRegistry()
    steps = NoFillSteps(TrainerMetrics(registry), producer=None, channel_dir=None, every_steps=2)
    assert not any(steps.quiet(s) for s in range(10))  # nothing to keep quiet
    outcomes = []
    for step_s, profiling in [(5.0, True), (0.9, True), (0.2, False), (0.4, False)]:
        steps.begin()
        outcomes.append(steps.end(step_s=step_s, profiling=profiling, quiet=False))
    assert outcomes == [None, None, "no-fill", "no-fill"]
    assert steps.baseline_s == pytest.approx(0.3)
    assert _value(registry, "pipefill_trainer_baseline_steps_total", source="no-fill") == 2


def test_predicted_bubble_seconds_by_kind_count_unannounced_bubbles_too() -> None:
    registry = CollectorRegistry()
    m = TrainerMetrics(registry)
    m.observe_bubble(kind="steady", measured_s=0.010, predicted_s=0.012, announced=True)
    m.observe_bubble(kind="steady", measured_s=0.001, predicted_s=0.0005, announced=False)
    m.observe_bubble(kind="cool-down", measured_s=0.002, predicted_s=0.0, announced=False)
    assert _value(registry, "pipefill_trainer_bubble_predicted_seconds_total", kind="steady") == pytest.approx(0.0125)
    assert _value(registry, "pipefill_trainer_bubble_predicted_seconds_total", kind="cool-down") == 0.0
    assert _value(registry, "pipefill_trainer_bubble_predicted_seconds_total", kind="warm-up") == 0.0


def test_a_quiet_step_announces_nothing_on_time_or_late(tmp_path: Path) -> None:
    """On the real channel (its ring of closed bubbles): a slot announced on time and a slot that would be announced
    late both stay silent in a quiet step, and announce again in the next."""
    actions = [Action(0, Kind.F, 0), Action(0, Kind.B, 0), Action(0, Kind.F, 1)]
    on_time = Slot(1, "steady", 0.005, 0)
    late = Slot(2, "steady", 0.0001, 1)
    for w in (0.004, 0.005, 0.006, 0.007, 0.0001, 0.0001, 0.0001, 0.0002):
        late.learn(w)
    producer = Producer.create(channel_dir=tmp_path)
    try:
        ann = BubbleAnnouncer(
            actions=actions,
            slots={1: on_time, 2: late},
            producer=producer,
            min_bubble_s=0.001,
            free_bytes=lambda: 7,
            late_after_s=0.0003,
        )
        for quiet in (True, False):
            ann.begin_step(9, quiet=quiet)
            for idx in (1, 2):
                ann.wait_begin(idx)
                ann.while_waiting(idx, lambda: False)  # the input never arrives while watched
                ann.wait_end(idx)
            records, opened = ann.records, len(producer.history())
            if quiet:
                assert [r.announced for r in records] == [False, False] and opened == 0
            else:
                assert [(r.announced, r.late) for r in records] == [(True, False), (True, True)] and opened == 2
    finally:
        producer.close()
