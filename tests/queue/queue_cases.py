"""Clusters and queues the queue's tests share: rank pods with reported bubble classes, and seeded mixed queues."""

from __future__ import annotations

import random

from pipefill.plan import BubbleClass, ProfilePoint
from pipefill.queue import FillJobView, RankView, TrainingJobView

__all__ = ["GIB", "HEAVY", "LIGHT", "MEDIUM", "mixed_queue", "ranks", "training_job"]

GIB = 1 << 30
# A large model: long steps, much memory; a small one: short steps; between them a medium one.
HEAVY = (ProfilePoint(1, 0.015, 3 * GIB), ProfilePoint(4, 0.045, 5 * GIB), ProfilePoint(16, 0.150, 10 * GIB))
MEDIUM = (ProfilePoint(1, 0.006, 1 * GIB), ProfilePoint(4, 0.018, 2 * GIB), ProfilePoint(16, 0.060, 4 * GIB))
LIGHT = (ProfilePoint(1, 0.002, GIB // 2), ProfilePoint(8, 0.012, GIB), ProfilePoint(32, 0.040, 2 * GIB))
LONG = (BubbleClass(0.200, 12 * GIB, 1.0),)  # one long bubble per step (end of step, GPipe-like)
SHORT = (BubbleClass(0.025, 4 * GIB, 8.0),)  # many short ones (1F1B steady state)
MIXED = (BubbleClass(0.120, 6 * GIB, 1.0), BubbleClass(0.020, 3 * GIB, 4.0))


def ranks(name: str, classes: tuple[BubbleClass, ...], count: int, *, step_s: float = 1.0) -> tuple[RankView, ...]:
    return tuple(RankView(r, f"{name}-0-{r}", f"uid-{name}-{r}", classes, step_s) for r in range(count))


def training_job(name: str, classes: tuple[BubbleClass, ...], count: int, **kw: object) -> TrainingJobView:
    return TrainingJobView(name, ranks=ranks(name, classes, count), **kw)  # type: ignore[arg-type]


def cluster() -> tuple[TrainingJobView, ...]:
    """Three training jobs of four ranks: long bubbles, short bubbles, and a mix."""
    return (training_job("long", LONG, 4), training_job("short", SHORT, 4), training_job("mixed", MIXED, 4))


def mixed_queue(seed: int, count: int = 48) -> tuple[list[FillJobView], dict[str, tuple[ProfilePoint, ...]]]:
    """``count`` inference jobs of the three profiles, 20–200 s of dedicated-device work each, some split across up
    to four ranks, created one second apart; with their true profiles (the views carry none until profiled)."""
    rng = random.Random(seed)
    views, true = [], {}
    for j in range(count):
        profile = rng.choice((HEAVY, MEDIUM, LIGHT))
        name = f"job-{j:02d}"
        true[name] = profile
        best_per_s = max(p.items / p.step_s for p in profile)
        views.append(
            FillJobView(
                name,
                total=int(10 ** rng.uniform(1.3, 2.3) * best_per_s),
                created_unix_s=float(j),
                max_parallel_ranks=rng.choice((1, 1, 2, 4)),
                estimate_step_s=profile[0].step_s,
                estimate_peak_bytes=profile[0].peak_bytes,
            )
        )
    return views, true
