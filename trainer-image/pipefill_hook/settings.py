"""The hook's settings: the environment the operator (or ``pipefill local``) gives the user's trainer container.

The names are the trainer's and the fill executor's (:mod:`pipefill.env`); the hook reads no spec file (parsing one
would need the core's YAML and schema packages in the user's image), so the operator passes the fill settings it
needs as variables. Every malformed value is an error naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipefill import env

__all__ = ["ENV_PROFILE_STEPS", "HookSettings"]

ENV_PROFILE_STEPS = "PIPEFILL_HOOK_PROFILE_STEPS"
"""steps before bubbles are announced: the first is warm-up, the others are measured (default 3, at least 2)"""


@dataclass(frozen=True)
class HookSettings:
    rank: int
    """the global rank (torch's ``RANK``)"""
    local_rank: int
    """``LOCAL_RANK``: only local rank 0 of a pod announces and serves metrics (one channel, one port per pod)"""
    job_name: str
    channel_dir: Path | None
    """None: bubbles are measured, not announced (``spec.fill.enabled: false``)"""
    metrics_port: int
    out_dir: Path | None
    min_bubble_s: float | None
    """spec.fill.minBubbleMilliseconds in seconds; None (unset): the fill's floor (pipefill_trainer.instrument)"""
    reserved_bytes: int
    """the device memory a bubble offers on CPU (``spec.fill.reservedMemory``)"""
    late_after_s: float
    baseline_every_steps: int
    profile_steps: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HookSettings:
        e = os.environ if environ is None else environ
        channel, out = e.get(env.CHANNEL_DIR, ""), e.get(env.OUT_DIR, "")
        local_rank = env.env_int("LOCAL_RANK", 0, environ=e)
        profile_steps = env.env_int(ENV_PROFILE_STEPS, 3, environ=e)
        if profile_steps < 2:
            raise ValueError(
                f"environment variable {ENV_PROFILE_STEPS}={profile_steps} must be at least 2 "
                "(one warm-up step, then at least one measured step)"
            )
        return cls(
            rank=env.env_int("RANK", 0, environ=e),
            local_rank=local_rank,
            job_name=e.get(env.JOB_NAME, ""),
            channel_dir=Path(channel) if channel and local_rank == 0 else None,
            metrics_port=env.env_int(env.METRICS_PORT, 0, environ=e) if local_rank == 0 else 0,
            out_dir=Path(out) if out else None,
            min_bubble_s=env.min_bubble_s(environ=e),
            reserved_bytes=env.env_int(env.FILL_RESERVED_BYTES, 0, environ=e),
            late_after_s=env.env_int(env.TRAINER_LATE_ANNOUNCE_US, 0, environ=e) / 1e6,
            baseline_every_steps=env.env_int(env.BASELINE_EVERY_STEPS, 50, environ=e),
            profile_steps=profile_steps,
        )
