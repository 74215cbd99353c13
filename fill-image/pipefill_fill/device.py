"""Attach to the device: the trainer's GPU (by the UUIDs it publishes on the channel) or the CPU, CPU pinning, and the
allocator cap that keeps the fill within its memory budget."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch

from pipefill import env

__all__ = ["cap_memory", "parse_cpu_list", "pin_cpus", "select_device"]

log = logging.getLogger("pipefill_fill")


def parse_cpu_list(text: str) -> set[int]:
    """``"0"``, ``"0,2"`` or ``"0-3,6"`` → a set of CPU numbers; errors name the variable."""
    return env.cpu_list(text)


def pin_cpus(text: str | None) -> set[int] | None:
    """Pin this process to the CPUs in ``text`` (the trainer's core on CPU runs) and use one torch thread per core."""
    if not text:
        return None
    cpus = parse_cpu_list(text)
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))
    return cpus


def select_device(requested: str | None, trainer_gpu_uuids: Sequence[str] = ()) -> torch.device:
    """The device to run on.

    ``requested`` is ``PIPEFILL_DEVICE`` ("cpu", "cuda", "cuda:N"; unset: cuda when available). For "cuda" without an
    index, the GPU whose UUID the trainer published is chosen (the fallback sharing mode sees all of the node's GPUs);
    without published UUIDs, the current CUDA device.
    """
    choice = (requested or ("cuda" if torch.cuda.is_available() else "cpu")).strip()
    if choice == "cpu":
        return torch.device("cpu")
    if not choice.startswith("cuda"):
        raise ValueError(f"{env.DEVICE}={requested!r}: expected cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(
            f"{env.DEVICE}={requested!r}: CUDA is not available in this container; use cpu or expose a GPU"
        )
    if ":" in choice:
        return torch.device(choice)
    wanted = {_norm_uuid(u) for u in trainer_gpu_uuids if u}
    if wanted:
        for idx in range(torch.cuda.device_count()):
            if _norm_uuid(str(torch.cuda.get_device_properties(idx).uuid)) in wanted:
                return torch.device("cuda", idx)
        raise ValueError(
            f"the trainer's GPU {sorted(wanted)} is not visible to the fill executor "
            f"({torch.cuda.device_count()} visible); check NVIDIA_VISIBLE_DEVICES or the shared ResourceClaim"
        )
    return torch.device("cuda", torch.cuda.current_device())


def cap_memory(device: torch.device, budget_bytes: int) -> float | None:
    """Cap the caching allocator at ``budget_bytes`` on a GPU; returns the fraction set (None on CPU)."""
    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = max(0.0, min(1.0, budget_bytes / total))
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def _norm_uuid(text: str) -> str:
    return text.lower().removeprefix("gpu-").replace("-", "")
