"""Connect the trainer to the bubble channel (``pipefill.channel``) as its producer.

Kept apart so the rest of the trainer depends only on the small :class:`~pipefill_trainer.instrument.BubbleProducer`
protocol. The channel is created at startup, before the first step, so the fill executor can attach while the trainer
profiles. Without a channel directory (fill disabled) bubbles are measured and logged but not announced.
"""

from __future__ import annotations

import torch

from pipefill.channel import Producer
from pipefill_trainer.config import TrainerConfig
from pipefill_trainer.devsync import GPU_SAFETY_BYTES, device_uuids, free_bytes_fn

__all__ = ["GPU_SAFETY_BYTES", "connect_producer", "device_uuids", "free_bytes_fn"]


def connect_producer(cfg: TrainerConfig, *, device: torch.device, stage_idx: int, num_stages: int) -> Producer | None:
    """The channel producer for this rank, or ``None`` when bubbles are not to be announced."""
    if cfg.channel_dir is None:
        return None
    return Producer.create(
        channel_dir=cfg.channel_dir,
        job_name=cfg.job.name,
        rank=cfg.rank,
        stage_idx=stage_idx,
        num_stages=num_stages,
        gpu_uuids=device_uuids(device),
    )
