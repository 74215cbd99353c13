"""Work while the bubble lasts (issue #25 item 3): past the planned end, while the channel says the bubble is open, a
job with partial steps goes on piece by piece, no piece predicted longer than the continuation bound
(``PIPEFILL_FILL_CONTINUE_PIECE_US``), so the trainer's resume waits at most one piece. A fake clock and a bubble held
open until a random moment."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from pipefill.plan import ProfilePoint
from pipefill_fill.inbubble import run_steps
from pipefill_fill.inpieces import PieceCosts
from pipefill_fill.pieces import Flight
from pipefill_fill.predict import Estimator, StepModel
from pipefill_fill.settings import Settings

MS = 1_000_000


class _Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


@dataclass
class _Bubble:
    id: int
    open_ns: int
    expected_end_ns: int


class _Task:
    """A slice with endless work whose batches run in two pieces of ``piece_ns`` each, on the fake clock."""

    def __init__(self, clock: _Clock, piece_ns: int) -> None:
        self.clock, self.piece_ns = clock, piece_ns
        self.flight: Flight | None = None
        self.flight_misses = self.deferred = self.progress = 0
        self.first_call = False
        self.pieces = self

    def done(self) -> bool:
        return False

    def commit_due(self) -> bool:
        return False

    def in_flight(self) -> Flight | None:
        return self.flight

    def drop_in_flight(self) -> None:
        self.flight = None

    def step_piece(self, batch_size: int) -> int:
        if self.flight is None:
            self.flight = Flight(batch_size, 2, 0, None)
        self.clock.ns += self.piece_ns
        self.flight.done += 1
        if self.flight.done < self.flight.pieces:
            return 0
        self.flight = None
        self.progress += batch_size
        return batch_size

    def step(self, batch_size: int) -> int:
        assert self.flight is None
        self.clock.ns += 2 * self.piece_ns
        self.progress += batch_size
        return batch_size


def _bubble(piece_ms: float, bound_ms: float, close_ns: int) -> tuple[list[tuple[int, int]], int, _Task]:
    """One bubble expected to end at 20 ms (deadline 19.5 ms), closed at ``close_ns``: the spans run, and how many
    were continued."""
    clock, piece_ns = _Clock(), int(piece_ms * MS)
    task = _Task(clock, piece_ns)
    points = [ProfilePoint(4, 2 * piece_ms / 1e3, 0, piece_s=(piece_ms / 1e3, piece_ms / 1e3))]
    out = run_steps(
        _Bubble(1, 0, 20 * MS),
        task=task,  # type: ignore[arg-type]
        max_batch=4,
        model=StepModel({4: 2 * piece_ms / 1e3}, clock=clock),
        commit_estimate=Estimator(default_s=0.01),
        is_open=lambda _id: clock.ns < close_ns,
        deadline_ns=19_500_000,
        device=torch.device("cpu"),
        any_size=False,
        clock=clock,
        pieces=PieceCosts(points),
        continue_piece_s=bound_ms / 1e3,
    )
    return out.spans_ns, out.continued, task


@pytest.mark.parametrize("seed", range(20))
def test_the_continuation_never_runs_past_the_close_by_more_than_one_piece(seed: int) -> None:
    rng = random.Random(seed)
    close_ns = int(rng.uniform(19.5, 40.0) * MS)  # the trainer's actual resume, after the planned end
    spans, continued, _ = _bubble(0.7, 1.0, close_ns)
    assert all(start < close_ns for start, _ in spans)  # no piece starts once the bubble closed
    assert spans[-1][1] - close_ns <= int(0.7 * MS)  # the trainer's resume waits at most one piece
    planned = spans[: len(spans) - continued]
    assert all(end <= 19_550_000 for _, end in planned)  # planned: by the deadline (+ the 50 µs overrun budget)
    if close_ns > 19_500_000 + int(0.7 * MS):
        assert continued >= 1  # the trainer still idle: the bubble was used on


def test_no_continuation_with_pieces_longer_than_the_bound_or_with_it_off() -> None:
    spans, continued, _ = _bubble(0.7, 0.5, 40 * MS)  # pieces of 0.7 ms, bound 0.5 ms
    assert continued == 0 and spans[-1][1] <= 19_550_000
    spans, continued, _ = _bubble(0.7, 0.0, 40 * MS)  # off
    assert continued == 0 and spans[-1][1] <= 19_550_000


def test_the_bound_is_its_own_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEFILL_WORK_SOURCE", "files:/nowhere")
    assert Settings.from_env().continue_piece_s == 0.0  # off unless set
    monkeypatch.setenv("PIPEFILL_FILL_CONTINUE_PIECE_US", "300")
    settings = Settings.from_env()
    assert settings.continue_piece_s == pytest.approx(300e-6) and settings.overrun_budget_s == pytest.approx(50e-6)
    monkeypatch.setenv("PIPEFILL_FILL_CONTINUE_PIECE_US", "20000")
    with pytest.raises(ValueError, match="PIPEFILL_FILL_CONTINUE_PIECE_US=20000: the longest piece"):
        Settings.from_env()
