"""Point-to-point transport between pipeline ranks: real (torch.distributed isend/irecv) or replayed.

The executor asks for a peer's tensor with :meth:`recv` (posted ahead of use) and waits on the handle right before the
action that needs it — the one place a rank blocks inside a step, and so where a bubble opens. Replay mode swaps in
:class:`ReplayTransport`: no peers; each "receive" completes at the absolute time the modeled timeline says the peer's
data arrives, and sends are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

import torch
import torch.distributed as dist

__all__ = ["DistTransport", "RecvHandle", "ReplayTransport", "Transport"]


class RecvHandle(Protocol):
    def done(self) -> bool: ...

    def wait(self) -> torch.Tensor: ...


class Transport(Protocol):
    def step_begin(self, start_ns: int) -> None: ...

    def recv(
        self, *, action_idx: int, shape: tuple[int, ...], dtype: torch.dtype, src: int, tag: int
    ) -> RecvHandle: ...

    def send(self, tensor: torch.Tensor, *, dst: int, tag: int) -> None: ...

    def flush(self) -> None: ...


class _DistRecv:
    __slots__ = ("buf", "work")

    def __init__(self, buf: torch.Tensor, work: dist.Work) -> None:
        self.buf, self.work = buf, work

    def done(self) -> bool:
        return bool(self.work.is_completed())

    def wait(self) -> torch.Tensor:
        self.work.wait()
        return self.buf


class DistTransport:
    """isend/irecv on the default process group; ``src``/``dst`` are global ranks, tags tell streams apart."""

    def __init__(self, *, device: torch.device) -> None:
        self.device = device
        self._sends: list[tuple[dist.Work, torch.Tensor]] = []  # the tensor stays alive until its send is done

    def step_begin(self, start_ns: int) -> None:
        pass

    def recv(self, *, action_idx: int, shape: tuple[int, ...], dtype: torch.dtype, src: int, tag: int) -> RecvHandle:
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        work = dist.irecv(buf, src=src, tag=tag)
        assert work is not None  # irecv returns None only for ranks outside the group
        return _DistRecv(buf, work)

    def send(self, tensor: torch.Tensor, *, dst: int, tag: int) -> None:
        tensor = tensor.contiguous()
        work = dist.isend(tensor, dst=dst, tag=tag)
        assert work is not None
        self._sends.append((work, tensor))

    def flush(self) -> None:
        """Wait until every send of the step was taken by its peer (buffers may be freed after)."""
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()


class _ReplayRecv:
    __slots__ = ("buf", "release_ns")

    def __init__(self, buf: torch.Tensor, release_ns: int) -> None:
        self.buf, self.release_ns = buf, release_ns

    def done(self) -> bool:
        return time.monotonic_ns() >= self.release_ns

    def wait(self) -> torch.Tensor:
        # sleep to the absolute release time, then spin the last stretch (sleep overshoots by ~50-100 µs)
        while (left_ns := self.release_ns - time.monotonic_ns()) > 0:
            if left_ns > 300_000:
                time.sleep((left_ns - 200_000) / 1e9)
        return self.buf


class ReplayTransport:
    """Peers replaced by the modeled timeline: the data for action ``i`` arrives ``release_s[i]`` after step start."""

    def __init__(self, *, device: torch.device, release_s: Mapping[int, float] | None = None) -> None:
        self.device = device
        self.release_s: dict[int, float] = dict(release_s or {})
        self._step_start_ns = time.monotonic_ns()
        self._buffers: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}

    def step_begin(self, start_ns: int) -> None:
        self._step_start_ns = start_ns

    def recv(self, *, action_idx: int, shape: tuple[int, ...], dtype: torch.dtype, src: int, tag: int) -> RecvHandle:
        key = (shape, dtype)
        if key not in self._buffers:  # fixed stand-in data: same compute cost as real activations
            gen = torch.Generator().manual_seed(len(self._buffers))
            self._buffers[key] = (torch.randn(shape, generator=gen) * 0.02).to(dtype=dtype, device=self.device)
        release_ns = self._step_start_ns + int(self.release_s.get(action_idx, 0.0) * 1e9)
        return _ReplayRecv(self._buffers[key], release_ns)

    def send(self, tensor: torch.Tensor, *, dst: int, tag: int) -> None:
        pass

    def flush(self) -> None:
        pass
