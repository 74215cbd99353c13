"""A fake clock for the in-bubble loop with a workload in pieces: each step or piece moves it by what it is said to
cost (one encoder layer of a batch: :func:`piece_s`), times ``slow`` from ``slow_from_ns`` on; the workload's work
is real. Shared by tests/fill/test_fill_pieces.py and tests/fill/test_fill_split.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from pipefill.plan import ProfilePoint
from pipefill_fill.inbubble import BubbleOutcome, run_steps
from pipefill_fill.inpieces import PieceCosts
from pipefill_fill.predict import Estimator, StepModel
from pipefill_fill.task import FillTask


def piece_s(batch_size: int) -> float:
    return 0.25e-3 + 0.05e-3 * batch_size  # a fake cost: one encoder layer of a batch


class PieceClock:
    """A fake CLOCK_MONOTONIC patched into ``task``'s steps (``layers`` pieces each); ``slow`` (1: none) applies to
    the steps and pieces that start from ``slow_from_ns`` on (a slow spell of the machine)."""

    def __init__(self, task: FillTask, layers: int) -> None:
        self.ns, self.slow, self.slow_from_ns = 0, 1.0, 0
        self.cpu_ns = 0  # the thread's CPU time: a slow spell (the core taken away) does not add to it
        step, step_piece = task.step, task.step_piece

        def cost_ns(pieces: int, batch_size: int) -> int:
            factor = self.slow if self.ns >= self.slow_from_ns else 1.0
            self.cpu_ns += int(1e9 * pieces * piece_s(batch_size))
            return int(1e9 * factor * pieces * piece_s(batch_size))

        def timed_step(batch_size: int) -> int:
            flight = task.in_flight()
            left = flight.pieces - flight.done if flight is not None else layers
            self.ns += cost_ns(left, flight.batch_size if flight is not None else batch_size)
            return step(batch_size)

        def timed_piece(batch_size: int) -> int:
            flight = task.in_flight()
            self.ns += cost_ns(1, flight.batch_size if flight is not None else batch_size)
            return step_piece(batch_size)

        task.step, task.step_piece = timed_step, timed_piece  # type: ignore[method-assign]

    def __call__(self) -> int:
        return self.ns

    def cpu(self) -> int:
        """The step clock of an executor at idle priority on a CPU (pipefill_fill.device.step_clock)."""
        return self.cpu_ns


def model_and_costs(clock: PieceClock, layers: int) -> tuple[StepModel, PieceCosts]:
    """A step model and piece costs profiled at batch sizes 1, 2, 4 and 8 by :func:`piece_s`."""
    points = [ProfilePoint(b, layers * piece_s(b), 0, piece_s=(piece_s(b),) * layers) for b in (1, 2, 4, 8)]
    return StepModel({p.batch_size: p.step_s for p in points}, clock=clock), PieceCosts(points)


def bubble(
    task: FillTask, model: StepModel, costs: PieceCosts, clock: PieceClock, *, i: int, deadline_ns: int, **kw: Any
) -> BubbleOutcome:
    """Bubble ``i``, opened now on ``clock``, always open, batches of at most 8, on the CPU."""
    return run_steps(
        SimpleNamespace(id=i, open_ns=clock.ns, expected_end_ns=deadline_ns),
        task=task,
        max_batch=8,
        model=model,
        commit_estimate=Estimator(default_s=0.0),
        is_open=lambda _id: True,
        deadline_ns=deadline_ns,
        device=torch.device("cpu"),
        clock=clock,
        pieces=costs,
        **kw,
    )
