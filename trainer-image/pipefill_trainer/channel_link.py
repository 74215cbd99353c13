"""Connect the trainer to the bubble channel (``pipefill.channel``) as its producer.

Kept apart so the rest of the trainer depends only on the small :class:`~pipefill_trainer.instrument.BubbleProducer`
protocol. The channel is created at startup, before the first step, so the fill executor can attach while the trainer
profiles. Without a channel directory (fill disabled) bubbles are measured and logged but not announced.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pipefill.channel import Producer
from pipefill_trainer.config import TrainerConfig

__all__ = ["GPU_SAFETY_BYTES", "connect_producer", "device_uuids", "free_bytes_fn"]

GPU_SAFETY_BYTES = 512 * 2**20
"""never offered: the trainer's allocator may still grow a little inside a bubble"""


def device_uuids(device: torch.device) -> list[str]:
    """UUIDs of the GPU the trainer uses (what the fill executor selects under visibleDevices); [] on CPU."""
    if device.type != "cuda":
        return []
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):
        return []
    return [uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"]


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


def free_bytes_fn(device: torch.device, *, reserved_bytes: int) -> Callable[[], int]:
    """The device memory a bubble offers: on CUDA what is free now less :data:`GPU_SAFETY_BYTES`; on CPU the
    configured budget (``spec.fill.reservedMemory``)."""
    if device.type != "cuda":
        return lambda: reserved_bytes

    def gpu_free() -> int:
        free, _ = torch.cuda.mem_get_info(device)
        return max(0, free - GPU_SAFETY_BYTES)

    return gpu_free
