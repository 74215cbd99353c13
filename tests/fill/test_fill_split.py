"""A whole step predicted longer than ``split_above_s`` runs in pieces (issue #31): each piece starts only while it fits
what is left, so a slow spell that catches a step stops it at a piece boundary, and the bubble overruns by one piece's
excess, not the whole step's. The real encoder and FillTask on a fake clock that moves by what each piece is said to
cost; the same bubbles with ``split_above_s=0`` run whole steps and overrun by several times as much."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fill_helpers import write_job

from pipefill.plan import ProfilePoint
from pipefill.spec import load_file
from pipefill_fill.inbubble import BubbleOutcome, run_steps
from pipefill_fill.inpieces import PieceCosts
from pipefill_fill.predict import Estimator, StepModel
from pipefill_fill.settings import Settings
from pipefill_fill.task import FillTask, TaskSpec

LAYERS = 6
PARAMS = {"layers": LAYERS, "hiddenSize": 32, "heads": 2, "seqLen": 16}
BUBBLE_NS = 10_000_000  # usable length of every bubble (open to deadline)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _piece_s(batch_size: int) -> float:
    return 0.25e-3 + 0.05e-3 * batch_size  # one encoder layer of a batch: a batch of 8 is 6 × 0.65 = 3.9 ms


class _SlowableClock:
    """A fake CLOCK_MONOTONIC that moves by what each step or piece costs, times ``slow`` (a slow spell of the
    machine: the host took part of the core)."""

    def __init__(self, task: FillTask) -> None:
        self.ns, self.slow = 0, 1.0
        step, step_piece = task.step, task.step_piece

        def timed_step(batch_size: int) -> int:
            flight = task.in_flight()
            left = flight.pieces - flight.done if flight is not None else LAYERS
            size = flight.batch_size if flight is not None else batch_size
            self.ns += int(1e9 * self.slow * left * _piece_s(size))
            return step(batch_size)

        def timed_piece(batch_size: int) -> int:
            flight = task.in_flight()
            self.ns += int(1e9 * self.slow * _piece_s(flight.batch_size if flight is not None else batch_size))
            return step_piece(batch_size)

        task.step, task.step_piece = timed_step, timed_piece  # type: ignore[method-assign]

    def __call__(self) -> int:
        return self.ns


def _bubbles(jobs_dir: Path, split_above_s: float, slow_bubbles: set[int]) -> list[tuple[BubbleOutcome, int]]:
    """20 bubbles of the encoder; the machine runs ``4×`` slower in those numbered in ``slow_bubbles``. Each bubble's
    outcome and deadline."""
    (job,) = load_file(write_job(jobs_dir, f"split-{int(split_above_s * 1e6)}", total=10_000, parameters=PARAMS))
    task = FillTask(TaskSpec.from_spec(job))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    clock = _SlowableClock(task)
    points = [ProfilePoint(b, LAYERS * _piece_s(b), 0, piece_s=(_piece_s(b),) * LAYERS) for b in (1, 2, 4, 8)]
    model, costs = StepModel({p.batch_size: p.step_s for p in points}, clock=clock), PieceCosts(points)
    outcomes = []
    for i in range(20):
        clock.slow = 4.0 if i in slow_bubbles else 1.0
        open_ns = clock.ns = i * 100_000_000
        deadline_ns = open_ns + BUBBLE_NS
        out = run_steps(
            SimpleNamespace(id=i, open_ns=open_ns, expected_end_ns=deadline_ns),
            task=task,
            max_batch=8,
            model=model,
            commit_estimate=Estimator(default_s=0.0),
            is_open=lambda _id: True,
            deadline_ns=deadline_ns,
            device=torch.device("cpu"),
            clock=clock,
            pieces=costs,
            split_above_s=split_above_s,
        )
        outcomes.append((out, deadline_ns))
    return outcomes


def _overrun_ms(out: BubbleOutcome, deadline_ns: int) -> float:
    return max(0.0, ((out.last_end_ns or 0) - deadline_ns) / 1e6)


def test_a_step_longer_than_the_split_runs_in_pieces_and_a_slow_spell_overruns_by_one_piece(jobs_dir: Path) -> None:
    slow = {12, 16}
    split = _bubbles(jobs_dir, Settings.split_above_s, slow)
    whole = _bubbles(jobs_dir, 0.0, slow)
    # at normal speed the split runs the same batches as whole steps, all their pieces in the bubble
    normal = [out for i, (out, _) in enumerate(split) if i not in slow]
    assert all("p" in out.kinds for out in normal), [out.kinds for out in normal]
    long_whole = [
        (e - s) / 1e6 for out in normal for (s, e), k in zip(out.spans_ns, out.kinds, strict=True) if k == "w"
    ]
    assert all(ms <= Settings.split_above_s * 1e3 for ms in long_whole), long_whole  # only short steps run whole
    assert all("w" in out.kinds for i, (out, _) in enumerate(whole) if i not in slow)
    assert sum(o.items for o, _ in split) >= 0.9 * sum(o.items for o, _ in whole)  # little lost to the pieces
    for i in slow:  # at most one 4×-slow piece's excess past the deadline: 3 × 0.65 ms
        assert _overrun_ms(*split[i]) <= 3 * _piece_s(8) * 1e3 + 0.1, split[i][0].kinds
    # 4× their base: interrupted (the learnt margin leaves them out); none at normal speed
    assert all(out.interrupted == set(range(out.steps)) for out, _ in (split[i] for i in slow))
    assert not any(out.interrupted for out in normal)
    assert max(_overrun_ms(*whole[i]) for i in slow) >= max(_overrun_ms(*split[i]) for i in slow) + 3.0


def test_split_above_is_read_from_the_environment_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEFILL_WORK_SOURCE", "files:/nowhere")
    assert Settings.from_env().split_above_s == pytest.approx(2e-3)
    monkeypatch.setenv("PIPEFILL_FILL_SPLIT_ABOVE_US", "0")
    assert Settings.from_env().split_above_s == 0.0
    monkeypatch.setenv("PIPEFILL_FILL_SPLIT_ABOVE_US", "-5")
    with pytest.raises(ValueError, match=r"PIPEFILL_FILL_SPLIT_ABOVE_US=-5: the longest step run whole"):
        Settings.from_env()
