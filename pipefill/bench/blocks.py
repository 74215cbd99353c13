"""The blocked run of ``pipefill bench colocation``: training alone (A) and with fill (B) alternating inside one run.

One training run with its fill executors, as mode B of the separate runs. After the warm-up (fill on: its start-up
and profile), the benchmark holds the fill for a block of steps (``fill.hold`` in each rank's channel directory,
:func:`pipefill.channel.hold_fill`: the executor takes no bubble and sleeps off the futex; the trainer goes on
announcing), releases it for the next block, and so on: A B A B … A. It watches rank 0's event log to switch at
step boundaries; which steps were A and which B is then read from the executors' own ``hold`` records (a step
during which either rank's fill changed state belongs to neither). Both modes share the processes, the caches and
the machine's load, which is what lets the slowdown be resolved to a fraction of a percent on a noisy machine
(:mod:`pipefill.bench.paired`).

Recovery: the fill's step time inside the trainer's waits per B step ÷ the trainer's measured idle time per A step
(both ranks summed), so that neither announcing less nor holding a bubble idle can raise it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from pipefill.bench.colocation_run import (
    gpu_samplers,
    gpu_utilization,
    manifests,
    processes,
    rank_stats,
    run_processes,
)
from pipefill.bench.paired import Block, blocks_of, bootstrap_ci, hold_label, pair_slowdowns
from pipefill.bench.runs import BenchError
from pipefill.channel import hold_fill
from pipefill.channel.nextopen import NextOpen
from pipefill.events import BubbleEvent, Event, EventTail, HoldEvent, StepEvent, read_events
from pipefill.local.report import rank_log_paths

__all__ = ["run_blocks"]


class _Switcher:
    """Holds and releases every rank's fill at the block boundaries, as rank 0's trainer reports its steps."""

    def __init__(self, log: Path, channels: list[Path], *, first_step: int, block_steps: int, blocks: int) -> None:
        self.tail, self.channels = EventTail(log), channels
        self.first, self.block, self.blocks = first_step, block_steps, blocks
        self.done = -1  # the last step rank 0 finished
        self.current: int | None = None  # the block switched to

    def __call__(self) -> None:
        for e in self.tail.read():
            if isinstance(e, StepEvent):
                self.done = max(self.done, e.step)
        j = (self.done + 1 - self.first) // self.block  # the block the next step belongs to
        if j < 0 or j >= self.blocks or j == self.current:
            return
        self.current = j
        for channel in self.channels:
            hold_fill(channel, j % 2 == 0)  # A on even blocks: A B A B … A


def _labels(run_dir: Path, ranks: list[int], first: int, last: int) -> tuple[dict[int, str | None], dict[int, float]]:
    """Per step in [first, last): A, B or None (both ranks' fills must agree for the whole step), and the
    pipeline's step time (its slowest rank's)."""
    labels: dict[int, str | None] = {}
    step_s: dict[int, float] = defaultdict(float)
    for rank in ranks:
        trainer_log, fill_log = rank_log_paths(run_dir, rank)
        holds = [(e.mono_ns, e.held) for e in read_events(fill_log) if isinstance(e, HoldEvent)]
        for e in read_events(trainer_log):
            if isinstance(e, StepEvent) and first <= e.step < last:
                label = hold_label(holds, e.start_ns, e.start_ns + int(e.step_s * 1e9))
                labels[e.step] = label if labels.get(e.step, label) == label else None
                step_s[e.step] = max(step_s[e.step], e.step_s)
    return labels, step_s


def open_errors_ns(trainer: list[Event], first_step: int) -> list[int]:
    """|actual − predicted| open of each announced bubble from ``first_step`` on, as the fill's own model
    (:class:`NextOpen`, what a spinning consumer predicts) would have predicted it: replayed over the trainer's
    waits (a wait's start and end are its bubble's open and close, to a few µs; the position is the wait's action
    index, where the consumer has the bubble's kind and microbatch: the same on a 2-stage pipeline)."""
    waits = sorted(
        (e for e in trainer if isinstance(e, BubbleEvent) and e.announced and e.step >= first_step),
        key=lambda e: e.start_ns,
    )
    model = NextOpen(errors=len(waits) + 1)
    prev: BubbleEvent | None = None
    predicted = 0
    for w in waits:
        if prev is not None:
            model.observe((prev.kind, prev.idx), prev.end_ns, w.start_ns, predicted)
        predicted, prev = model.predict((w.kind, w.idx), w.end_ns), w
    return [abs(e) for e in model.errors_ns]


def _rank_figures(run_dir: Path, rank: int, blocks: list[Block]) -> dict[str, Any]:
    trainer, fill = (read_events(p) for p in rank_log_paths(run_dir, rank))
    starts = {e.step: (e.start_ns, e.start_ns + int(e.step_s * 1e9)) for e in trainer if isinstance(e, StepEvent)}
    out: dict[str, Any] = {"rank": rank, "open_errors_ns": open_errors_ns(trainer, min(b.steps[0] for b in blocks))}
    for label in ("A", "B"):
        steps = {s for b in blocks if b.label == label for s in b.steps}
        t0, t1 = min(starts[s][0] for s in steps), max(starts[s][1] for s in steps)
        summary = rank_stats(trainer, fill, steps, t0, t1).summary()
        out[label] = {"steps": len(steps), **{k: summary[k] for k in ("bubble_s", "announced_bubble_s")}}
        out[label].update({k: summary[k] for k in ("fill_step_s", "fill_overrun_past_close_s", "idle_breakdown")})
    return out


def run_blocks(
    a: argparse.Namespace, schedule: str, m: int, run_dir: Path, *, warmup_steps: int, profile_steps: int = 3
) -> dict[str, Any]:
    """One blocked run of one configuration: its processes, then the slowdown with its interval and the recovery."""
    blocks = 2 * a.block_pairs + 1
    job, fills = manifests(a, schedule, m, "pipefill", run_dir, warmup_steps, steps=blocks * a.block_steps)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    channel_root = Path(tempfile.mkdtemp(prefix="pipefill-blocks-", dir=shm))
    procs = processes(
        a, job, fills, mode="pipefill", run_dir=run_dir, channel_root=channel_root, profile_steps=profile_steps
    )
    switch = _Switcher(
        rank_log_paths(run_dir, a.ranks[0])[0],
        [channel_root / f"rank{r}" for r in a.ranks],
        first_step=warmup_steps,
        block_steps=a.block_steps,
        blocks=blocks,
    )
    try:
        with gpu_samplers(a) as samplers:
            notes = run_processes(procs, a.timeout_s, tick=switch, poll_s=0.01)
    finally:
        shutil.rmtree(channel_root, ignore_errors=True)
    labels, step_s = _labels(run_dir, a.ranks, warmup_steps, warmup_steps + blocks * a.block_steps)
    got = blocks_of(labels, step_s, settle=a.settle_steps)
    if sum(b.label == "A" for b in got) < 2 or sum(b.label == "B" for b in got) < 1:
        raise BenchError(f"{run_dir}: too few complete blocks ({[b.label for b in got]}); raise --block-steps")
    pairs = pair_slowdowns(got)
    ci = bootstrap_ci(pairs)
    ranks = [_rank_figures(run_dir, r, got) for r in a.ranks]
    n_a, n_b = (sum(len(b.steps) for b in got if b.label == x) for x in ("A", "B"))
    idle_a = sum(r["A"]["bubble_s"] for r in ranks) / n_a
    work_b = sum(r["B"]["fill_step_s"] for r in ranks) / n_b
    offered_b = sum(r["B"]["announced_bubble_s"] for r in ranks) / n_b
    mean_a = statistics.fmean(s for b in got if b.label == "A" for s in b.step_s)
    mean_b = statistics.fmean(s for b in got if b.label == "B" for s in b.step_s)
    errors = sorted(e for r in ranks for e in r.pop("open_errors_ns"))
    # NVML utilization in the A and B blocks' steps (their settled steps, as timed by the first replayed rank)
    times = {
        e.step: (e.start_ns, e.start_ns + int(e.step_s * 1e9))
        for e in read_events(rank_log_paths(run_dir, a.ranks[0])[0])
        if isinstance(e, StepEvent)
    }
    util = {
        label: gpu_utilization(samplers, [times[s] for b in got if b.label == label for s in b.steps if s in times])
        for label in ("A", "B")
    }
    return {
        "slowdown": statistics.fmean(pairs) if pairs else None,
        "slowdown_ci": list(ci) if ci else None,
        "bubble_recovery": work_b / idle_a if idle_a else None,
        "announced_recovery": work_b / offered_b if offered_b else None,
        "alone_step_s": mean_a,
        "fill_step_s": mean_b,
        "idle_s_per_step_alone": idle_a,
        "fill_s_per_step": work_b,
        # what a spinning fill would have predicted (pipefill bench channel --open-error-us takes this)
        "open_prediction_error_us": {
            f"p{q}": round(errors[min(len(errors) - 1, len(errors) * q // 100)] / 1e3, 1) for q in (50, 90, 99)
        }
        if errors
        else None,
        "pairs": len(pairs),
        "pair_slowdowns": pairs,
        "blocks": [{"label": b.label, "steps": len(b.steps), "mean_step_s": b.mean_s} for b in got],
        "transition_steps": sum(1 for v in labels.values() if v is None),
        **{f"{k}_{'alone' if label == 'A' else 'fill'}": v for label, u in util.items() for k, v in u.items()},
        "fill_notes": notes,
        "ranks": ranks,
    }
