"""The trainer's configuration: what the operator (or ``pipefill local``) gives the trainer container.

torch.distributed's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; the job spec from the mounted file
(``PIPEFILL_SPEC_FILE``); the bubble channel directory and the rest of :mod:`pipefill.env`. The same entry point runs
in a pod and locally; command-line options only override for benchmarks and tests.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipefill import env
from pipefill.spec import PipelineTrainingJob, load_training_job, parse_bytes
from pipefill_trainer.baseline import DEFAULT_EVERY_STEPS

__all__ = ["ConfigError", "TrainerConfig"]


class ConfigError(ValueError):
    """The spec or the environment can never work (exit 2, permanent). The message names field, value, rule, fix."""


@dataclass(frozen=True)
class TrainerConfig:
    job: PipelineTrainingJob
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    device: str
    """"cpu", "cuda" or "cuda:N" (``PIPEFILL_DEVICE``; default cuda when available)"""
    channel_dir: Path | None
    """the bubble channel directory; None: bubbles are not announced (fill disabled)"""
    out_dir: Path | None
    """where the event log and the profile go (``PIPEFILL_OUT_DIR``); None: not written"""
    metrics_port: int
    """Prometheus port; 0: no endpoint"""
    cpu_affinity: tuple[int, ...] | None
    schedule_csv: str | None
    """the schedule of ``schedule: custom``"""
    comm_timeout_s: float
    """a peer silent this long ends the step with exit 75; default 300 s"""
    steps: int
    """optimizer steps to train (spec.steps unless overridden)"""
    replay_stage: int | None = None
    """replay mode: run only this pipeline rank's compute, peers modeled (:class:`pipefill_trainer.peers.ReplayPeers`)"""
    profile_steps: int = 3
    """steps without bubble announcements at the start: the first is warm-up, the rest are profiled"""
    reserved_bytes: int = 0
    """device memory kept for fill work (spec.fill.reservedMemory); on CPU the fill's whole budget"""
    baseline_every_steps: int = DEFAULT_EVERY_STEPS
    """one step in this many announces no bubble, for the no-fill baseline (``PIPEFILL_BASELINE_EVERY_STEPS``;
    0: never; :mod:`pipefill_trainer.baseline`)"""
    late_announce_s: float = 0.0
    """a wait that was not announced and still goes on after this long is announced late (trainer.md, *Late
    announcements*; ``PIPEFILL_TRAINER_LATE_ANNOUNCE_US``); 0: never"""

    @property
    def pp(self) -> int:
        return self.job.spec.pipeline.stages

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        spec_path: str | None = None,
        steps: int | None = None,
        replay_stage: int | None = None,
        profile_steps: int = 3,
    ) -> TrainerConfig:
        e = dict(os.environ if environ is None else environ)
        path = spec_path or e.get(env.SPEC_FILE)
        if not path:
            raise ConfigError(f"no job spec: set {env.SPEC_FILE} to the PipelineTrainingJob manifest or pass --spec")
        try:
            job = load_training_job(path)
        except ValueError as exc:  # SpecError is a ValueError with every violation in its message
            raise ConfigError(str(exc)) from None
        pipe = job.spec.pipeline
        if replay_stage is not None:
            if not 0 <= replay_stage < pipe.stages:
                raise ConfigError(
                    f"--replay-stage {replay_stage} is outside 0..{pipe.stages - 1} (spec.pipeline.stages); "
                    "pick a pipeline rank of the job"
                )
            rank, world, addr, port = replay_stage, 1, "127.0.0.1", 0
        else:
            rank, world = _int(e, "RANK", 0), _int(e, "WORLD_SIZE", 1)
            addr, port = e.get("MASTER_ADDR", "127.0.0.1"), _int(e, "MASTER_PORT", 29500)
            if world != job.world_size:
                raise ConfigError(
                    f"WORLD_SIZE={world} but the job {job.name!r} needs stages × dataParallel = {job.world_size} ranks; "
                    "start one trainer per rank or fix spec.pipeline"
                )
            if not 0 <= rank < world:
                raise ConfigError(f"RANK={rank} is outside 0..{world - 1}; set RANK to this pod's global rank")
        csv_text = None
        if pipe.schedule == "custom":
            csv_text = _schedule_csv(e, path, pipe.custom_schedule.key if pipe.custom_schedule else "schedule.csv")
        device = e.get(env.DEVICE) or _default_device()
        if device != "cpu" and not device.startswith("cuda"):
            raise ConfigError(f"{env.DEVICE}={device!r} must be cpu, cuda or cuda:N")
        affinity = e.get(env.CPU_AFFINITY)
        try:
            cpus = tuple(sorted(env.cpu_list(affinity))) if affinity else None
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        channel = e.get(env.CHANNEL_DIR, env.DEFAULT_CHANNEL_DIR) if job.spec.fill.enabled else None
        every = _int(e, env.BASELINE_EVERY_STEPS, DEFAULT_EVERY_STEPS)
        if every < 0 or every == 1:
            raise ConfigError(
                f"{env.BASELINE_EVERY_STEPS}={every}: must be 0 (no quiet steps) or at least 2 (1 would announce no "
                f"bubble at all); the default is {DEFAULT_EVERY_STEPS}"
            )
        return cls(
            job=job,
            rank=rank,
            world_size=world,
            master_addr=addr,
            master_port=port,
            device=device,
            channel_dir=Path(channel) if channel else None,
            out_dir=Path(e[env.OUT_DIR]) if e.get(env.OUT_DIR) else None,
            metrics_port=_int(e, env.METRICS_PORT, 0),
            cpu_affinity=cpus,
            schedule_csv=csv_text,
            comm_timeout_s=float(_int(e, env.COMM_TIMEOUT_S, 300)),
            steps=steps if steps is not None else job.spec.steps,
            replay_stage=replay_stage,
            profile_steps=profile_steps,
            reserved_bytes=parse_bytes(job.spec.fill.reserved_memory, field="spec.fill.reservedMemory"),
            baseline_every_steps=every,
            late_announce_s=_late_announce_s(e),
        )


def _int(e: Mapping[str, str], name: str, default: int) -> int:
    try:
        return env.env_int(name, default, environ=e)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


LATE_ANNOUNCE_US = 0
"""default of ``PIPEFILL_TRAINER_LATE_ANNOUNCE_US`` (docs/trainer.md, *Late announcements*)"""


def _late_announce_s(e: Mapping[str, str]) -> float:
    us = _int(e, env.TRAINER_LATE_ANNOUNCE_US, LATE_ANNOUNCE_US)
    if not 0 <= us <= 100_000:
        raise ConfigError(
            f"{env.TRAINER_LATE_ANNOUNCE_US}={us}: must be within 0..100000 µs (0 turns late announcements off); "
            f"unset it for the default {LATE_ANNOUNCE_US}"
        )
    return us / 1e6


def _schedule_csv(e: Mapping[str, str], spec_path: str, key: str) -> str:
    path = Path(e.get(env.SCHEDULE_FILE) or Path(spec_path).parent / key)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"schedule custom needs its CSV (spec.pipeline.customSchedule key {key!r}): cannot read {path}: "
            f"{exc.strerror}; mount the ConfigMap beside the spec or set {env.SCHEDULE_FILE}"
        ) from None


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
