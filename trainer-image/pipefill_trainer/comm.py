"""Point-to-point transport between pipeline ranks: real (torch.distributed isend/irecv) or replayed.

The executor asks for a peer's tensor with :meth:`recv` (posted ahead of use) and waits on the handle right before the
action that needs it — the one place a rank blocks inside a step, and so where a bubble opens. Replay mode swaps in
:class:`ReplayTransport`: no peers; each "receive" completes at the absolute time the modeled timeline says the peer's
data arrives, and sends are dropped.

A *stream* is a directed stage edge ``(src_stage, dst_stage)`` (:func:`pipefill.schedules.validate.p2p_streams`).
:class:`DistTransport` gives every stream of every data-parallel replica its own two-rank process group and never
uses tags: NCCL ignores them and matches a communicator's messages in posting order, so the order is made to agree
instead — within a group there is one direction and one stream, the sender posts in its action order and the
executor posts the receives in that same order. gloo (CPU) with the one constant tag matches the same way, so every
CPU run exercises NCCL's rule.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from pipefill.schedules.model import Schedule
from pipefill.schedules.validate import p2p_streams

__all__ = ["DistTransport", "RecvHandle", "ReplayTransport", "Stream", "Transport"]

Stream = tuple[int, int]
"""``(src_stage, dst_stage)``: ``s → s+1`` activations or ``s+1 → s`` input gradients."""


class RecvHandle(Protocol):
    def done(self) -> bool: ...

    def wait(self) -> torch.Tensor: ...


class Transport(Protocol):
    def step_begin(self, start_ns: int) -> None: ...

    def recv(self, *, action_idx: int, shape: tuple[int, ...], dtype: torch.dtype, stream: Stream) -> RecvHandle: ...

    def send(self, tensor: torch.Tensor, *, stream: Stream) -> None: ...

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
    """isend/irecv with one constant tag; ``links[stream]`` is the stream's process group and the peer's rank in it.

    :meth:`open` gives every stream its own two-rank group — the only layout under which NCCL's matching in posting
    order is right for every schedule (see docs/trainer.md); other layouts are for tests that show why.
    """

    def __init__(self, *, device: torch.device, links: Mapping[Stream, tuple[dist.ProcessGroup, int]]) -> None:
        self.device = device
        self._links = dict(links)
        self._sends: list[tuple[dist.Work, torch.Tensor]] = []  # the tensor stays alive until its send is done

    @classmethod
    def open(
        cls,
        *,
        device: torch.device,
        schedule: Schedule,
        replicas: Sequence[Sequence[int]],
        rank: int,
        timeout: timedelta | None = None,
    ) -> DistTransport:
        """One two-rank process group per stream of ``rank``'s replica; collective (every rank calls it).

        ``replicas[d][pp_rank]`` is the global rank of pipeline rank ``pp_rank`` in data-parallel replica ``d``. Every
        rank creates every replica's groups in the same order (``new_group`` requires it), then each stream is opened
        by one handshake in that same global order: on NCCL the first operation on a group creates its communicator
        and blocks until the peer joins, and a fixed global order cannot deadlock (the earliest unopened stream always
        has both ends waiting on it). ``timeout``: of every operation on these groups (torch's default: 30 min).
        """
        links: dict[Stream, tuple[dist.ProcessGroup, int]] = {}
        opened: list[tuple[Stream, int, bool]] = []  # (stream, replica, this rank sends) in the global order
        streams = p2p_streams(schedule)
        for replica_idx, replica in enumerate(replicas):
            for st in streams:
                src, dst = replica[st.src_rank], replica[st.dst_rank]
                group = dist.new_group([src, dst], timeout=timeout)
                if rank in (src, dst):
                    key = (st.src_stage, st.dst_stage)
                    links[key] = (group, dist.get_group_rank(group, dst if rank == src else src))
                    opened.append((key, replica_idx, rank == src))
        transport = cls(device=device, links=links)
        for key, replica_idx, sending in opened:
            transport._handshake(key, replica_idx, sending=sending)
        return transport

    def _handshake(self, stream: Stream, replica_idx: int, *, sending: bool) -> None:
        """Open the stream's group with one message naming it; the receiver checks that both ends agree."""
        group, peer = self._links[stream]
        expect = torch.tensor([*stream, replica_idx], dtype=torch.int64, device=self.device)
        if sending:
            work = dist.isend(expect, group=group, group_dst=peer)
            assert work is not None
            work.wait()
            return
        got = torch.empty_like(expect)
        work = dist.irecv(got, group=group, group_src=peer)
        assert work is not None
        work.wait()
        if not torch.equal(got, expect):
            raise RuntimeError(
                f"point-to-point stream {stream} of replica {replica_idx}: the peer opened {got.tolist()} on the same "
                "process group; the ranks built different schedules or replicas (check the spec is the same on all)"
            )

    def step_begin(self, start_ns: int) -> None:
        pass

    def recv(self, *, action_idx: int, shape: tuple[int, ...], dtype: torch.dtype, stream: Stream) -> RecvHandle:
        group, peer = self._links[stream]
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        work = dist.irecv(buf, group=group, group_src=peer)
        assert work is not None  # irecv returns None only for ranks outside the group
        return _DistRecv(buf, work)

    def send(self, tensor: torch.Tensor, *, stream: Stream) -> None:
        group, peer = self._links[stream]
        tensor = tensor.contiguous()
        work = dist.isend(tensor, group=group, group_dst=peer)
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

    def recv(self, *, action_idx: int, shape: tuple[int, ...], dtype: torch.dtype, stream: Stream) -> RecvHandle:
        key = (shape, dtype)
        if key not in self._buffers:  # fixed stand-in data: same compute cost as real activations
            gen = torch.Generator().manual_seed(len(self._buffers))
            self._buffers[key] = (torch.randn(shape, generator=gen) * 0.02).to(dtype=dtype, device=self.device)
        release_ns = self._step_start_ns + int(self.release_s.get(action_idx, 0.0) * 1e9)
        return _ReplayRecv(self._buffers[key], release_ns)

    def send(self, tensor: torch.Tensor, *, stream: Stream) -> None:
        pass

    def flush(self) -> None:
        pass
