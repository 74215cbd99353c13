"""The statistics of a blocked run: steps labelled A (fill held) or B (fill on), blocks, neighbour pairs, a bootstrap.

A run alternates A B A B … A in blocks of steps inside one training run, so both modes share the processes, the
caches and the machine's load. Each B block is compared with the mean of the A blocks on either side of it, which
cancels a drift of the machine's speed that is linear over the three blocks; the slowdown is the mean over B blocks
of ``B ÷ mean(A before, A after) − 1``, and its 95 % interval is a percentile bootstrap over those pairs.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Block", "blocks_of", "bootstrap_ci", "hold_label", "pair_slowdowns"]


def hold_label(holds: Sequence[tuple[int, bool]], start_ns: int, end_ns: int) -> str | None:
    """``"A"`` when the fill was held during all of [start_ns, end_ns], ``"B"`` when it was never held then, None
    when its state changed inside. ``holds``: (CLOCK_MONOTONIC ns, held) in time order; not held before the first."""
    state, label = False, None
    for at, held in holds:
        if at <= start_ns:
            state = held
        elif at < end_ns:
            return None
        else:
            break
    label = "A" if state else "B"
    return label


@dataclass(frozen=True)
class Block:
    """Consecutive steps of one label (after its settle steps): their indices and their step times, seconds."""

    label: str
    steps: tuple[int, ...]
    step_s: tuple[float, ...]

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.step_s)


def blocks_of(labels: Mapping[int, str | None], step_s: Mapping[int, float], *, settle: int = 1) -> list[Block]:
    """Blocks from per-step labels (a None label ends a block and belongs to none); the first ``settle`` steps of
    each block are dropped (caches, the fill's first bubble after a hold), and blocks left empty with them."""
    out: list[Block] = []
    run: list[int] = []
    label: str | None = None

    def close() -> None:
        kept = run[settle:]
        if label is not None and kept:
            out.append(Block(label, tuple(kept), tuple(step_s[s] for s in kept)))

    for step in sorted(labels):
        this = labels[step]
        if this != label or (run and step != run[-1] + 1):
            close()
            run, label = [], this
        if this is not None:
            run.append(step)
    close()
    return out


def pair_slowdowns(blocks: Sequence[Block]) -> list[float]:
    """Per B block: its mean step time ÷ the mean of its neighbouring A blocks' − 1 (one neighbour at an edge; a B
    block with no A neighbour is left out)."""
    out = []
    for i, b in enumerate(blocks):
        if b.label != "B":
            continue
        near = [blocks[j].mean_s for j in (i - 1, i + 1) if 0 <= j < len(blocks) and blocks[j].label == "A"]
        if near:
            out.append(b.mean_s / statistics.fmean(near) - 1)
    return out


def bootstrap_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``values`` (None with fewer than 2 values)."""
    n = len(values)
    if n < 2:
        return None
    rnd = random.Random(seed)
    means = sorted(sum(values[rnd.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    return means[int(tail * resamples)], means[min(resamples - 1, int((1 - tail) * resamples))]
