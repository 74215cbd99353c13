"""Offload mode: between bubbles, the fill's weights and optimizer state live in pinned host memory.

For fill models larger than the memory the trainer leaves free between bubbles: at a bubble's start the state is
copied to the device, at its end back to pinned host memory, so the fill holds device memory only inside bubbles. The
copies are timed; the runner counts them (in + out) against the bubble like a step, and the planner as ``transfer_s``.
Parameters keep their identity (their ``.data`` is swapped), so optimizer state keyed by parameter stays valid.
On the CPU there is nothing to move and offload does nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

__all__ = ["Offloader"]


class Offloader:
    def __init__(self, modules: list[torch.nn.Module | torch.optim.Optimizer], device: torch.device) -> None:
        self.modules = modules
        self.device = device
        self.enabled = device.type == "cuda"
        self.on_device = True
        self._host: dict[tuple[int, str], torch.Tensor] = {}
        self._moved: list[tuple[object, str]] = []

    def _device_tensors(self) -> Iterator[tuple[object, str, torch.Tensor]]:
        """(owner, key, tensor) for every parameter, buffer and optimizer state tensor on the device."""
        for m in self.modules:
            if isinstance(m, torch.nn.Module):
                for p in m.parameters():
                    yield p, "data", p.data
                for mod in m.modules():
                    for name, b in mod._buffers.items():
                        if b is not None:
                            yield mod._buffers, name, b
            else:
                for state in m.state.values():
                    for k, v in state.items():
                        if isinstance(v, torch.Tensor):
                            yield state, k, v

    def to_host(self) -> float:
        """Move everything to pinned host memory; returns the seconds it took (0 when disabled)."""
        if not self.enabled or not self.on_device:
            return 0.0
        t0 = time.perf_counter()
        self._moved = []
        for owner, key, t in list(self._device_tensors()):
            if t.device.type == "cpu":
                continue  # e.g. Adam's step counter
            slot = (id(owner), key)
            host = self._host.get(slot)
            if host is None or host.shape != t.shape or host.dtype != t.dtype:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                self._host[slot] = host
            host.copy_(t, non_blocking=True)
            _set(owner, key, host)
            self._moved.append((owner, key))
        torch.cuda.synchronize(self.device)
        self.on_device = False
        return time.perf_counter() - t0

    def to_device(self) -> float:
        """Bring everything back to the device; returns the seconds it took (0 when disabled)."""
        if not self.enabled or self.on_device:
            return 0.0
        t0 = time.perf_counter()
        for owner, key in self._moved:
            _set(owner, key, self._host[(id(owner), key)].to(self.device, non_blocking=True))
        torch.cuda.synchronize(self.device)
        self.on_device = True
        return time.perf_counter() - t0


def _set(owner: object, key: str, value: torch.Tensor) -> None:
    if isinstance(owner, torch.Tensor):
        owner.data = value
    else:
        owner[key] = value  # type: ignore[index]
