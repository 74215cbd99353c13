"""Connect the trainer to the bubble channel (``pipefill.channel``) as its producer.

Kept apart so the rest of the trainer depends only on the small :class:`~pipefill_trainer.instrument.BubbleProducer`
protocol. Without a channel directory (fill disabled) bubbles are measured and logged but not announced.
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
        props = torch.cuda.get_device_properties(device)
        return [f"GPU-{props.uuid}"]
    except (AttributeError, RuntimeError):
        return []


def connect_producer(cfg: TrainerConfig, *, device: torch.device) -> Any:
    """The channel producer for this rank, or ``None`` when bubbles are not to be announced."""
    if cfg.channel_dir is None:
        return None
    try:
        from pipefill import channel

        producer_cls = channel.Producer  # type: ignore[attr-defined]
    except (ImportError, AttributeError):
        print(f"rank {cfg.rank}: pipefill.channel is not available; bubbles are measured but not announced", flush=True)
        return None
    producer = producer_cls(cfg.channel_dir)
    producer.publish_device(uuids=device_uuids(device), device=str(device))
    return producer
