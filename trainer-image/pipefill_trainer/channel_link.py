"""Connect the trainer to the bubble channel (``pipefill.channel``) as its producer.

Kept apart so the rest of the trainer depends only on the small :class:`~pipefill_trainer.instrument.BubbleProducer`
protocol. The channel is created at startup, before the first step, so the fill executor can attach while the trainer
profiles. Without a channel directory (fill disabled) bubbles are measured and logged but not announced.
"""

from __future__ import annotations

from typing import Any

import torch

from pipefill_trainer.config import TrainerConfig

__all__ = ["connect_producer", "device_uuids"]


def device_uuids(device: torch.device) -> list[str]:
    """UUIDs of the GPU the trainer uses (what the fill executor selects under visibleDevices); [] on CPU."""
    if device.type != "cuda":
        return []
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):
        return []
    return [uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"]


def connect_producer(cfg: TrainerConfig, *, device: torch.device, stage_idx: int, num_stages: int) -> Any:
    """The channel producer for this rank, or ``None`` when bubbles are not to be announced."""
    if cfg.channel_dir is None:
        return None
    from pipefill.channel import Producer

    return Producer.create(
        channel_dir=cfg.channel_dir,
        job_name=cfg.job.name,
        rank=cfg.rank,
        stage_idx=stage_idx,
        num_stages=num_stages,
        gpu_uuids=device_uuids(device),
    )
