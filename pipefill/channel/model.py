"""What the channel carries, as values: bubbles, ring records, the fill's answer, the channel's identity."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

__all__ = ["Bubble", "BubbleKind", "BubbleRecord", "ChannelInfo", "FillAnswer", "FillState"]


class BubbleKind(enum.StrEnum):
    """Where in the step a bubble falls; the values are the schedule simulator's and the metric labels."""

    WARM_UP = "warm-up"
    STEADY = "steady"
    COOL_DOWN = "cool-down"
    END_OF_STEP = "end-of-step"

    @property
    def code(self) -> int:
        """The value of ``bubble_kind`` on the wire (1..4)."""
        return _KIND_CODES[self]

    @classmethod
    def from_code(cls, code: int) -> BubbleKind:
        return _KINDS_BY_CODE.get(code, BubbleKind.STEADY)


_KIND_CODES = {BubbleKind.WARM_UP: 1, BubbleKind.STEADY: 2, BubbleKind.COOL_DOWN: 3, BubbleKind.END_OF_STEP: 4}
_KINDS_BY_CODE = {v: k for k, v in _KIND_CODES.items()}
KIND_CODE_BY_NAME: dict[str, int] = {str(k): v for k, v in _KIND_CODES.items()}


class FillState(enum.IntEnum):
    """The fill's answer for its current bubble."""

    IDLE = 0
    RUNNING = 1
    YIELDED = 2


@dataclass(frozen=True, slots=True)
class Bubble:
    """One announced bubble, as the fill saw it open. Times are CLOCK_MONOTONIC nanoseconds."""

    id: int
    kind: BubbleKind
    open_ns: int
    expected_end_ns: int
    free_bytes: int
    step: int
    mb_idx: int
    """microbatch whose wait this is; -1 for none (end-of-step)"""
    generation: int
    """which trainer initialization of the channel announced it"""

    @property
    def expected_duration_s(self) -> float:
        return (self.expected_end_ns - self.open_ns) / 1e9

    def remaining_s(self, now_ns: int | None = None) -> float:
        """Seconds until the expected end (negative once past it); says nothing about whether it is still open."""
        return (self.expected_end_ns - (time.monotonic_ns() if now_ns is None else now_ns)) / 1e9

    def deadline_ns(self, *, guard_s: float) -> int:
        """The time the fill must have yielded by: the expected end minus a guard (switch cost, jitter)."""
        return self.expected_end_ns - int(guard_s * 1e9)


@dataclass(frozen=True, slots=True)
class BubbleRecord:
    """One closed bubble from the ring: the trainer's prediction and measurement, and what the fill made of it."""

    id: int
    kind: BubbleKind
    step: int
    mb_idx: int
    open_ns: int
    predicted_ns: int
    actual_ns: int
    free_bytes: int
    filled_ns: int | None
    """busy time the fill reported; None when the fill has not acknowledged this bubble"""
    overrun_ns: int | None
    work: int | None

    @property
    def predicted_s(self) -> float:
        return self.predicted_ns / 1e9

    @property
    def actual_s(self) -> float:
        return self.actual_ns / 1e9

    @property
    def filled_s(self) -> float:
        return (self.filled_ns or 0) / 1e9


@dataclass(frozen=True, slots=True)
class FillAnswer:
    """The fill's answer block: its current or last bubble, and running totals since it attached."""

    bubble_id: int
    state: FillState
    yielded_ns: int
    used_ns: int
    overrun_ns: int
    work: int
    acked_total: int
    used_total_ns: int
    overrun_total_ns: int
    work_total: int


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """The channel's header: who owns it and which device the fill must select."""

    path: str
    layout_version: int
    generation: int
    ring_capacity: int
    job_name: str
    rank: int
    stage_idx: int
    num_stages: int
    gpu_uuids: tuple[str, ...]
    trainer_pid: int
    fill_pid: int
    created_ns: int
    trainer_heartbeat_ns: int
    fill_heartbeat_ns: int
