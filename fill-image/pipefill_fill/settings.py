"""The fill executor's settings, read once from the environment contract (:mod:`pipefill.env`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipefill import env
from pipefill.spec.resources import FillSettings

_SPEC = FillSettings()
"""spec.fill's defaults: what the executor assumes where the pod's environment leaves a setting out"""

__all__ = ["Settings"]


@dataclass(frozen=True)
class Settings:
    channel_dir: Path
    """the bubble channel directory (PIPEFILL_CHANNEL_DIR; default /run/pipefill)"""
    work_source: str
    """files:<dir> or kubernetes (PIPEFILL_WORK_SOURCE; required)"""
    training_job: str
    """the PipelineTrainingJob's name (PIPEFILL_JOB_NAME; default: the name the trainer publishes on the channel)"""
    rank: int
    """this pod's rank (PIPEFILL_RANK; default 0)"""
    reserved_bytes: int
    """device memory the fill may use (PIPEFILL_FILL_RESERVED_BYTES; default 2 GiB): the allocator cap"""
    min_bubble_s: float
    """bubbles shorter than this are not used (PIPEFILL_FILL_MIN_BUBBLE_MS; default 0)"""
    guard_s: float
    """yield this long before a bubble's expected end (PIPEFILL_FILL_GUARD_MS; default 1 ms)"""
    device: str | None
    """cpu, cuda or cuda:N (PIPEFILL_DEVICE; unset: cuda when available)"""
    cpu_affinity: str | None
    """CPU list to pin to (PIPEFILL_CPU_AFFINITY; unset: no pinning)"""
    metrics_port: int
    """Prometheus port (PIPEFILL_METRICS_PORT; 0 or unset: no endpoint)"""
    out_dir: Path | None
    """where the event log goes (PIPEFILL_OUT_DIR; unset: no event log)"""
    offload: bool
    """keep the fill's state in pinned host memory between bubbles (PIPEFILL_FILL_OFFLOAD=1; GPU only)"""
    end_quantile: float = 0.25
    """where the fill plans a bubble to end (PIPEFILL_FILL_END_QUANTILE): the trainer's expected end plus this
    quantile of how the trainer's last predictions at the bubble's position turned out (0.5: the median actual end;
    lower stops earlier: fewer steps past the close, less of the wait used); the guard comes off after"""
    overrun_budget_s: float = 5e-5
    """the expected overrun a step may have past the deadline (PIPEFILL_FILL_OVERRUN_BUDGET_US; default 50 µs; 0: only
    steps that would not have overrun in any recent measurement)"""
    continue_piece_s: float = 0.0
    """the continuation bound (PIPEFILL_FILL_CONTINUE_PIECE_US; default 0: off): past a bubble's planned end, while the
    channel says the bubble is open, a job with partial steps goes on piece by piece with pieces predicted to take at
    most this long, so the trainer's resume waits at most one of them. Not the overrun budget (the expected overrun
    of a step planned to end by the deadline)"""
    split_above_s: float = 2e-3
    """a step predicted longer than this (PIPEFILL_FILL_SPLIT_ABOVE_US; default 2000 µs; 0: never) at a bubble's tail
    (the time left under :data:`pipefill_fill.inpieces.SPLIT_TAIL` times its prediction) runs in pieces where the
    workload has them (partial steps), each started only while it fits what is left, so a step that runs slow is
    stopped at its next piece and the bubble overruns by at most one piece's excess, not the whole step's (issue #31:
    a step planned into 8 ms that ran 25 ms of CPU on a VM whose host slowed the core). The batch goes on in the next
    bubble; a step that runs as predicted runs all its pieces in this one"""
    spin_s: float = 0.0
    """spin window around each predicted bubble open (PIPEFILL_FILL_SPIN_US; default 0: never spin). Only for a fill
    on a core its trainer does not use (docs/channel.md, "Spinning before a predicted bubble")"""
    cpu_idle: bool = False
    """run at the kernel's idle scheduling priority (SCHED_IDLE; PIPEFILL_FILL_CPU_PRIORITY=idle, the default when
    PIPEFILL_CPU_AFFINITY pins the executor to its trainer's core): the fill gets the CPU only when the trainer does not
    want it, so a job's start (imports, weights) or a step past the bubble's end never delays a training step there.
    ``normal`` keeps the default policy (a fill on cores of its own)"""
    margin_bytes: int = 64 * 2**20
    """device memory left unused below a bubble's free memory (allocator fragmentation, CUDA context growth)"""

    @classmethod
    def from_env(cls) -> Settings:
        e = os.environ
        source = e.get(env.WORK_SOURCE, "")
        if not source:
            raise ValueError(f"{env.WORK_SOURCE} is not set: set files:<dir> (local runs) or kubernetes")
        guard_ms = env.env_float(env.FILL_GUARD_MS, _SPEC.guard_milliseconds)
        min_ms = env.env_float(env.FILL_MIN_BUBBLE_MS, 0.0)
        spin_us = env.env_float(env.FILL_SPIN_US, 0.0)
        end_quantile = env.env_float(env.FILL_END_QUANTILE, 0.25)
        budget_us = env.env_float(env.FILL_OVERRUN_BUDGET_US, 50.0)
        continue_us = env.env_float(env.FILL_CONTINUE_PIECE_US, 0.0)
        split_us = env.env_float(env.FILL_SPLIT_ABOVE_US, 2000.0)
        if not 0 <= split_us <= 10**6:
            raise ValueError(
                f"{env.FILL_SPLIT_ABOVE_US}={split_us:g}: the longest step run whole at a bubble's tail must be "
                "within 0..1000000 µs (0: never split a step that fits whole; a few ms bounds what a slow step "
                "overruns by)"
            )
        if not 0 <= continue_us <= 10_000:
            raise ValueError(
                f"{env.FILL_CONTINUE_PIECE_US}={continue_us:g}: the longest piece run past a bubble's planned end must "
                "be within 0..10000 µs (0: no continuation); the trainer's resume may wait that long"
            )
        if not 0 <= budget_us <= 10_000:
            raise ValueError(
                f"{env.FILL_OVERRUN_BUDGET_US}={budget_us:g}: the expected overrun per step must be within 0..10000 µs"
            )
        if not 0 <= end_quantile <= 1:
            raise ValueError(
                f"{env.FILL_END_QUANTILE}={end_quantile:g}: the quantile must be within 0..1 (0.5: the median actual "
                "end of the bubble's position; lower: fewer fill steps past the trainer's resume)"
            )
        if guard_ms < 0 or min_ms < 0:
            raise ValueError(f"{env.FILL_GUARD_MS} and {env.FILL_MIN_BUBBLE_MS} must be ≥ 0 milliseconds")
        if not 0 <= spin_us <= 10_000:
            raise ValueError(
                f"{env.FILL_SPIN_US}={spin_us:g}: the spin window must be within 0..10000 µs (0: never spin); "
                "a few hundred µs covers the wake-up it replaces"
            )
        out = e.get(env.OUT_DIR)
        affinity = e.get(env.CPU_AFFINITY) or None
        priority = e.get(env.FILL_CPU_PRIORITY, "") or ("idle" if affinity else "normal")
        if priority not in ("idle", "normal"):
            raise ValueError(
                f"{env.FILL_CPU_PRIORITY}={priority!r}: expected idle (the fill takes only CPU time its trainer "
                "leaves; the default when pinned to the trainer's core) or normal"
            )
        return cls(
            channel_dir=Path(e.get(env.CHANNEL_DIR) or env.DEFAULT_CHANNEL_DIR),
            work_source=source,
            training_job=e.get(env.JOB_NAME, ""),
            rank=env.env_int(env.RANK, 0),
            reserved_bytes=env.env_int(env.FILL_RESERVED_BYTES, 2 * 2**30),
            min_bubble_s=min_ms / 1e3,
            guard_s=guard_ms / 1e3,
            device=e.get(env.DEVICE) or None,
            cpu_affinity=affinity,
            metrics_port=env.env_int(env.METRICS_PORT, 0),
            out_dir=Path(out) if out else None,
            offload=e.get(env.FILL_OFFLOAD, "") in ("1", "true", "True"),
            spin_s=spin_us / 1e6,
            end_quantile=end_quantile,
            overrun_budget_s=budget_us / 1e6,
            continue_piece_s=continue_us / 1e6,
            split_above_s=split_us / 1e6,
            cpu_idle=priority == "idle",
        )
