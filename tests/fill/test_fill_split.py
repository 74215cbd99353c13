"""A whole step predicted longer than ``split_above_s`` runs in pieces (issue #31): each piece starts only while it fits
what is left, so a slow spell that catches a step stops it at a piece boundary, and the bubble overruns by one piece's
excess, not the whole step's. The real encoder and FillTask on a fake clock that moves by what each piece is said to
cost; the same bubbles with ``split_above_s=0`` run whole steps and overrun by several times as much."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fill_helpers import write_job
from piece_clock import PieceClock, bubble, model_and_costs, piece_s

from pipefill.spec import load_file
from pipefill_fill.inbubble import BubbleOutcome
from pipefill_fill.inpieces import SPLIT_TAIL
from pipefill_fill.settings import Settings
from pipefill_fill.task import FillTask, TaskSpec

LAYERS = 6
PARAMS = {"layers": LAYERS, "hiddenSize": 32, "heads": 2, "seqLen": 16}
BUBBLE_NS = 10_000_000  # usable length of every bubble (open to deadline)
SPELL_MS = 3  # a slow spell begins this far into a slow bubble: its second step (batch 8, 3.9 ms) is the tail


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _bubbles(
    jobs_dir: Path, split_above_s: float, slow: dict[int, float], *, cpu_cost: bool = False
) -> list[tuple[BubbleOutcome, int]]:
    """20 bubbles of the encoder; in bubble ``i`` of ``slow`` the machine runs ``slow[i]`` times slower from
    ``SPELL_MS`` into the bubble on (the steps at its tail). Each bubble's outcome and deadline. ``cpu_cost``: the
    steps' costs are the thread's CPU time, as an executor at idle priority on a CPU counts them."""
    name = f"split-{int(split_above_s * 1e6)}{'-cpu' if cpu_cost else ''}"
    (job,) = load_file(write_job(jobs_dir, name, total=10_000, parameters=PARAMS))
    task = FillTask(TaskSpec.from_spec(job))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    clock = PieceClock(task, layers=LAYERS)
    model, costs = model_and_costs(clock, layers=LAYERS)
    outcomes = []
    for i in range(20):
        clock.slow = slow.get(i, 1.0)
        open_ns = clock.ns = i * 100_000_000
        clock.slow_from_ns = open_ns + SPELL_MS * 1_000_000
        deadline_ns = open_ns + BUBBLE_NS
        cost_clock = clock.cpu if cpu_cost else None
        out = bubble(
            task, model, costs, clock, i=i, deadline_ns=deadline_ns, split_above_s=split_above_s, cost_clock=cost_clock
        )
        outcomes.append((out, deadline_ns))
    return outcomes


def _overrun_ms(out: BubbleOutcome, deadline_ns: int) -> float:
    return max(0.0, ((out.last_end_ns or 0) - deadline_ns) / 1e6)


def test_a_step_longer_than_the_split_runs_in_pieces_and_a_slow_spell_overruns_by_one_piece(jobs_dir: Path) -> None:
    slow = {12: 2.5, 16: 4.0}
    split = _bubbles(jobs_dir, Settings.split_above_s, slow)
    whole = _bubbles(jobs_dir, 0.0, slow)
    # at normal speed the split runs the same batches as whole steps, all their pieces in the bubble
    normal = [(out, deadline) for i, (out, deadline) in enumerate(split) if i not in slow]
    assert all("p" in out.kinds for out, _ in normal), [out.kinds for out, _ in normal]  # the tails run in pieces
    long_whole = [
        (e - s, deadline - s)
        for out, deadline in normal
        for (s, e), k in zip(out.spans_ns, out.kinds, strict=True)
        if k == "w" and e - s > Settings.split_above_s * 1e9
    ]  # a long whole step only where a step twice as slow would still end by the deadline
    assert long_whole and all(left >= SPLIT_TAIL * length for length, left in long_whole), long_whole
    assert all("w" in out.kinds for i, (out, _) in enumerate(whole) if i not in slow)
    assert sum(o.items for o, _ in split) >= 0.9 * sum(o.items for o, _ in whole)  # little lost to the pieces
    for i, f in slow.items():  # at most one slow piece's excess past the deadline: (f − 1) × 0.65 ms
        assert _overrun_ms(*split[i]) <= (f - 1) * piece_s(8) * 1e3 + 0.1, split[i][0].kinds
    # 4× their base: interrupted (the learnt margin leaves them out); 2.5× and normal speed: not
    out, _ = split[16]
    assert out.interrupted and out.interrupted == {i for i, (s, _) in enumerate(out.spans_ns) if s % 10**8 >= 3e6}
    assert not any(o.interrupted for o, _ in normal) and not split[12][0].interrupted
    assert max(_overrun_ms(*whole[i]) for i in slow) >= max(_overrun_ms(*split[i]) for i in slow) + 3.0


def test_a_step_whose_core_was_taken_is_interrupted_though_its_cpu_time_is_as_usual(jobs_dir: Path) -> None:
    """On a CPU at idle priority the steps' cost is their CPU time: the trainer preempting a step makes it end late
    at its usual cost. It held nothing, and is left out of the learnt margin as any interrupted step (make demo: three
    such steps, 10-20 ms late, planned its bubbles at half their length)."""
    slow = {12: 2.5, 16: 4.0}
    split = Settings.split_above_s
    by_wall, by_cpu = _bubbles(jobs_dir, split, slow), _bubbles(jobs_dir, split, slow, cpu_cost=True)
    late = [out for i, (out, _) in enumerate(by_cpu) if i in slow]
    assert by_wall[16][0].interrupted and late[1].interrupted  # 4× as long: interrupted either way
    assert late[1].interrupted == {i for i, (s, _) in enumerate(late[1].spans_ns) if s % 10**8 >= 3e6}
    assert not late[0].interrupted and not any(o.interrupted for i, (o, _) in enumerate(by_cpu) if i not in slow)


def test_split_above_is_read_from_the_environment_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEFILL_WORK_SOURCE", "files:/nowhere")
    assert Settings.from_env().split_above_s == pytest.approx(2e-3)
    monkeypatch.setenv("PIPEFILL_FILL_SPLIT_ABOVE_US", "0")
    assert Settings.from_env().split_above_s == 0.0
    monkeypatch.setenv("PIPEFILL_FILL_SPLIT_ABOVE_US", "-5")
    with pytest.raises(ValueError, match=r"PIPEFILL_FILL_SPLIT_ABOVE_US=-5: the longest step run whole"):
        Settings.from_env()
