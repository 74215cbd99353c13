"""The blocked run's statistics: labels from the fill's hold records, blocks, neighbour pairs that cancel a linear
drift of the machine's speed, and a bootstrap interval that covers the true slowdown."""

from __future__ import annotations

import random

import pytest

from pipefill.bench.paired import Block, blocks_of, bootstrap_ci, hold_label, pair_slowdowns


def test_a_step_belongs_to_a_mode_only_if_the_fill_stayed_in_it() -> None:
    holds = [(100, True), (200, False), (300, True)]
    assert hold_label(holds, 0, 99) == "B"  # before the first hold: the fill works
    assert hold_label(holds, 100, 199) == "A"
    assert hold_label(holds, 150, 250) is None  # released inside the step
    assert hold_label(holds, 200, 299) == "B"
    assert hold_label(holds, 310, 400) == "A"
    assert hold_label([], 0, 10) == "B"


def test_blocks_drop_their_settle_steps_and_split_at_transitions() -> None:
    labels: dict[int, str | None] = {s: "A" for s in range(10, 14)} | {14: None} | {s: "B" for s in range(15, 19)}
    labels |= {19: "A", 20: "A"}
    step_s = {s: 0.1 + s / 1000 for s in labels}
    got = blocks_of(labels, step_s, settle=1)
    assert [(b.label, b.steps) for b in got] == [("A", (11, 12, 13)), ("B", (16, 17, 18)), ("A", (20,))]
    assert got[0].mean_s == pytest.approx(0.112)
    assert blocks_of({1: "A", 3: "A"}, {1: 0.1, 3: 0.1}, settle=0) == [
        Block("A", (1,), (0.1,)),
        Block("A", (3,), (0.1,)),
    ]  # a missing step also ends a block


def test_neighbour_pairs_cancel_a_linear_drift() -> None:
    # the machine slows down by 1 % per block; B costs exactly 2 %
    blocks = [Block("AB"[i % 2], (i,), ((1 + 0.01 * i) * (1.02 if i % 2 else 1.0),)) for i in range(9)]
    pairs = pair_slowdowns(blocks)
    assert len(pairs) == 4 and all(p == pytest.approx(0.02, abs=1e-9) for p in pairs)
    naive = [blocks[i].mean_s / blocks[i - 1].mean_s - 1 for i in range(1, 9, 2)]  # B against the A before only
    assert all(p > 0.029 for p in naive)
    assert pair_slowdowns([Block("B", (0,), (1.0,)), Block("A", (1,), (0.5,))]) == [1.0]  # one neighbour at an edge


def test_bootstrap_interval_covers_the_slowdown() -> None:
    rnd = random.Random(1)
    covered = 0
    for trial in range(40):
        values = [0.005 + rnd.gauss(0, 0.01) for _ in range(20)]
        lo, hi = bootstrap_ci(values, seed=trial, resamples=2000)  # type: ignore[misc]
        assert lo < sum(values) / 20 < hi
        covered += lo <= 0.005 <= hi
    assert covered >= 32  # a 95 % interval: rarely misses
    assert bootstrap_ci([0.01]) is None
    assert bootstrap_ci([0.01, 0.03], seed=5) == bootstrap_ci([0.01, 0.03], seed=5)
