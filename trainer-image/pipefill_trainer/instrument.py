"""Bubble instrumentation: profile the actions, predict every bubble with the timeline simulator, announce them.

1. *Profile*: the first steps run without announcements; step 0 is warm-up, the next ones are measured. Each rank's
   median seconds per (stage, action kind) are gathered over the pipeline into one profile JSON (the schema of
   ``Costs.from_profile``, written to ``$PIPEFILL_OUT_DIR/profile.json``).
2. *Predict*: :func:`pipefill.schedules.simulate` turns the profile into this rank's bubble slots: for every bubble, the
   index of the action that ends it (``before_action_idx``; ``len(actions)`` is the end-of-step bubble), its kind and
   its predicted length.
3. *Announce*: the executor calls :meth:`BubbleAnnouncer.wait_begin` right before it blocks; a slot predicted at
   least ``spec.fill.minBubbleMilliseconds`` long is opened on the channel with its predicted duration and the free
   device memory, and closed in :meth:`wait_end` when the wait returns.
4. *Learn*: after each step every slot's prediction becomes the median of its last measured idle times (seeded by
   the simulator's value); a wait where no bubble was predicted becomes a new slot.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipefill.env import AUTO_MIN_BUBBLE_MS
from pipefill.schedules.model import Action, Kind
from pipefill.schedules.timeline import Timeline

HISTORY = 5
"""measurements per bubble slot that its prediction is the median of"""
TAIL_HISTORY = 64
"""measurements per bubble slot that a late announcement's remaining time is estimated from"""
LATE_MIN_SAMPLES = 4
"""past waits that must have outlasted the late threshold before a wait is announced late"""
LATE_QUANTILE = 0.25
"""a late bubble is announced with this quantile of what the slot's past long waits had left at that point: low,
because a fill step planned into time that does not come delays the training"""

__all__ = ["BubbleAnnouncer", "BubbleProducer", "Slot", "build_profile", "slots_from", "stage_medians"]


class BubbleProducer(Protocol):
    """The producer side of the bubble channel; every call is bounded and never blocks."""

    def open_bubble(self, *, expected_duration_s: float, free_bytes: int, kind: str, step: int, mb_idx: int) -> int: ...

    def close_bubble(self, bubble_id: int) -> None: ...

    def fill_floor_s(self) -> float: ...


@dataclass
class Slot:
    """One bubble position of this rank: idle time before action ``action_idx`` of every step."""

    action_idx: int
    kind: str
    predicted_s: float
    mb_idx: int = -1
    history_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    tail_s: deque[float] = field(default_factory=lambda: deque(maxlen=TAIL_HISTORY))

    def learn(self, measured_s: float) -> None:
        """Prediction = median of the last :data:`HISTORY` measurements (the simulator's value seeds it): a median
        shrugs off the odd descheduled wait that would drag a mean."""
        if not self.history_s:
            self.history_s.append(self.predicted_s)
        self.history_s.append(measured_s)
        self.tail_s.append(measured_s)
        self.predicted_s = statistics.median(self.history_s)

    def late_remaining_s(self, after_s: float) -> float | None:
        """What a wait of this slot that has lasted ``after_s`` is expected to have left: the :data:`LATE_QUANTILE`
        of ``w − after_s`` over the slot's recent waits ``w`` longer than ``after_s``; None while fewer than
        :data:`LATE_MIN_SAMPLES` were."""
        rest = sorted(w - after_s for w in self.tail_s if w > after_s)
        if len(rest) < LATE_MIN_SAMPLES:
            return None
        return rest[int(LATE_QUANTILE * (len(rest) - 1))]


@dataclass
class _Record:
    action_idx: int
    kind: str
    predicted_s: float
    start_ns: int
    end_ns: int = 0
    announced: bool = False
    late: bool = False


def stage_medians(actions: Sequence[Action], durations_s: Sequence[Sequence[float]]) -> dict[int, dict[str, float]]:
    """Median seconds per stage per action kind over profiled steps (``durations_s[step][action_idx]``)."""
    samples: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for step in durations_s:
        for a, d in zip(actions, step, strict=True):
            samples[a.stage_idx][a.kind.value].append(d)
    return {s: {k: statistics.median(v) for k, v in kinds.items()} for s, kinds in samples.items()}


def build_profile(
    per_stage: dict[int, dict[str, float]], *, num_stages: int, extra: dict[int, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The profile JSON: one entry per stage in order, ``median_s`` per action kind (plus ``extra`` per stage)."""
    stages = []
    for s in range(num_stages):
        med = dict(per_stage.get(s, {}))
        if "B" not in med and not ("I" in med and "W" in med):
            med.setdefault("B", med.get("I", 0.0) + med.get("W", 0.0))
        med.setdefault("F", 0.0)
        stages.append({"stage_idx": s, "median_s": med, **(extra or {}).get(s, {})})
    return {"stages": stages, "p2p": {"latency_s": 0.0}, "step_end_s": 0.0}


def slots_from(timeline: Timeline, rank: int, actions: Sequence[Action]) -> dict[int, Slot]:
    """``rank``'s simulated bubbles as its slots, by the index of the action each precedes (of ``actions``, the
    rank's order)."""
    slots = {}
    for b in timeline.bubbles(rank):
        mb = actions[b.before_action_idx].mb_idx if b.before_action_idx < len(actions) else -1
        slots[b.before_action_idx] = Slot(b.before_action_idx, b.kind, b.duration_s, mb)
    return slots


def _kinds(actions: Sequence[Action]) -> Callable[[int], str]:
    first_grad = next((k for k, a in enumerate(actions) if a.kind in (Kind.B, Kind.I)), len(actions))
    last_fwd = max((k for k, a in enumerate(actions) if a.kind is Kind.F), default=-1)

    def kind(idx: int) -> str:
        if idx >= len(actions):
            return "end-of-step"
        if idx <= first_grad:
            return "warm-up"
        return "cool-down" if idx - 1 >= last_fwd else "steady"

    return kind


@dataclass
class BubbleAnnouncer:
    """The executor's :class:`~pipefill_trainer.executor.StepHooks` once the slots are known."""

    actions: Sequence[Action]
    slots: dict[int, Slot]
    producer: BubbleProducer | None
    min_bubble_s: float | None
    """spec.fill.minBubbleMilliseconds in seconds; None (unset): the fill's floor on the channel (:meth:`floor_s`)"""
    free_bytes: Callable[[], int]
    late_after_s: float = 0.0
    """announce a wait that was not announced once it has lasted this long (0: never)"""
    step: int = 0
    quiet: bool = False
    records: list[_Record] = field(default_factory=list)
    _open: tuple[int, _Record] | None = None
    _kind_of: Callable[[int], str] | None = None

    def __post_init__(self) -> None:
        self._kind_of = _kinds(self.actions)

    def floor_s(self) -> float:
        """The shortest bubble announced now: the spec's minimum where it sets one, otherwise the floor the fill
        published on the channel (the shortest bubble its work can use), or ``AUTO_MIN_BUBBLE_MS`` while it has none."""
        if self.min_bubble_s is not None:
            return self.min_bubble_s
        floor_s = self.producer.fill_floor_s() if self.producer is not None else 0.0
        return floor_s if floor_s > 0 else AUTO_MIN_BUBBLE_MS / 1e3

    def begin_step(self, step: int, *, quiet: bool = False) -> None:
        """``quiet``: announce no bubble in this step (measured as usual): a step of the no-fill baseline."""
        self.step, self.records, self.quiet = step, [], quiet

    def wait_begin(self, action_idx: int) -> None:
        slot = self.slots.get(action_idx)
        now = time.monotonic_ns()
        if slot is None:
            assert self._kind_of is not None
            self.records.append(_Record(action_idx, self._kind_of(action_idx), 0.0, now))
            return
        rec = _Record(action_idx, slot.kind, slot.predicted_s, now)
        self.records.append(rec)
        if self.producer is not None and not self.quiet and slot.predicted_s >= self.floor_s():
            bubble_id = self.producer.open_bubble(
                expected_duration_s=slot.predicted_s,
                free_bytes=self.free_bytes(),
                kind=slot.kind,
                step=self.step,
                mb_idx=slot.mb_idx,
            )
            rec.announced = True
            self._open = (bubble_id, rec)

    def while_waiting(self, action_idx: int, done: Callable[[], bool]) -> None:
        """Called right after :meth:`wait_begin`, before the rank blocks: a wait that was not announced (predicted
        shorter than the minimum bubble) but whose slot often ran long is watched for :attr:`late_after_s` by
        polling ``done`` (the rank would idle anyway; polling finds a short wait's end as fast as blocking), then
        announced with the time such waits had left (:meth:`Slot.late_remaining_s`). A short wait costs no more
        than before; a long one is no longer lost to the fill."""
        if self.producer is None or self.late_after_s <= 0 or self._open is not None or not self.records or self.quiet:
            return
        rec = self.records[-1]
        slot = self.slots.get(action_idx)
        if slot is None or rec.action_idx != action_idx:
            return
        remaining_s = slot.late_remaining_s(self.late_after_s)
        if remaining_s is None or remaining_s < self.floor_s():
            return
        until_ns = rec.start_ns + int(self.late_after_s * 1e9)
        while time.monotonic_ns() < until_ns:
            if done():
                return
        if done():
            return
        bubble_id = self.producer.open_bubble(
            expected_duration_s=remaining_s,
            free_bytes=self.free_bytes(),
            kind=slot.kind,
            step=self.step,
            mb_idx=slot.mb_idx,
        )
        rec.announced = rec.late = True
        self._open = (bubble_id, rec)

    def wait_end(self, action_idx: int) -> None:
        end = time.monotonic_ns()
        if self._open is not None:
            bubble_id, rec = self._open
            self._open = None
            assert self.producer is not None
            self.producer.close_bubble(bubble_id)
            rec.end_ns = end
        elif self.records:
            self.records[-1].end_ns = end

    def end_step(self) -> list[_Record]:
        """Update every slot from this step's measured waits; returns the step's bubble records."""
        measured = {r.action_idx: (r.end_ns - r.start_ns) / 1e9 for r in self.records}
        for idx, slot in self.slots.items():
            slot.learn(measured.pop(idx, 0.0))
        assert self._kind_of is not None
        for idx, got in measured.items():  # waits the timeline did not predict become slots, predicted 0 so far
            mb = self.actions[idx].mb_idx if idx < len(self.actions) else -1
            slot = self.slots[idx] = Slot(idx, self._kind_of(idx), 0.0, mb)
            slot.learn(got)
        return self.records
