"""The trainer's side of the bubble channel.

Every call is bounded and never waits for the fill: the trainer writes plain memory (a seqlock it alone writes),
and ``open_bubble`` adds one ``FUTEX_WAKE`` only while the fill has said it sleeps. ``close_bubble`` makes no
syscall at all. A missing, dead, slow or stopped fill executor changes nothing here.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import NoReturn

from pipefill.channel import layout as L
from pipefill.channel._files import CHANNEL_FILE, FILE_MODE, FILL_LOCK, TRAINER_LOCK, OwnerLock, resolve_dir
from pipefill.channel._mapping import Mapping
from pipefill.channel.errors import ChannelError
from pipefill.channel.futex import Futex
from pipefill.channel.model import KIND_CODE_BY_NAME, BubbleKind, BubbleRecord, ChannelInfo, FillAnswer

__all__ = ["Producer"]

_MAX_DURATION_S = 86_400.0


class Producer:
    """Owns the channel of one trainer process: creates (or re-initializes) it and announces bubbles.

    Use :meth:`create`; one producer per channel directory (a second one gets :class:`ChannelBusyError`).
    Not thread-safe: call it from the thread that runs the schedule.
    """

    def __init__(self, *, mapping: Mapping, lock: OwnerLock, fill_lock: OwnerLock, next_id: int) -> None:
        self._m = mapping
        self._mm = mapping.mm
        self._q, self._d = mapping.q, mapping.d
        self._lock = lock
        self._fill_lock = fill_lock
        self._futex = Futex(mapping.base + L.OFF_BUBBLE_SEQ)
        self._cap = mapping.ring_capacity
        self._seq = 0
        self._device_seq = 0
        self._next_id = next_id
        self._open: tuple[int, int, int, int, int, int, int] | None = None  # id, kind, open, end, free, step, mb

    @classmethod
    def create(
        cls,
        *,
        channel_dir: str | os.PathLike[str] | None = None,
        job_name: str = "",
        rank: int = 0,
        stage_idx: int = 0,
        num_stages: int = 1,
        gpu_uuids: Sequence[str] = (),
        ring_capacity: int = L.DEFAULT_RING_CAPACITY,
    ) -> Producer:
        """Take the channel directory (default ``$PIPEFILL_CHANNEL_DIR`` or ``/run/pipefill``) and publish a
        fresh channel file in it. A channel left by a trainer that died is replaced: its generation is counted on,
        its bubble ids continue, and a fill executor attached to it moves to the new file by itself."""
        if not 1 <= ring_capacity <= L.MAX_RING_CAPACITY:
            raise ValueError(f"ring_capacity={ring_capacity} must be within 1..{L.MAX_RING_CAPACITY}")
        identity = (rank, stage_idx, num_stages)
        if min(identity) < 0 or num_stages < 1 or stage_idx >= num_stages:
            raise ValueError(
                f"rank={rank}, stage_idx={stage_idx}, num_stages={num_stages}: need 0 ≤ stage_idx < num_stages"
            )
        job_raw = L.encode_job_name(job_name)
        uuid_raw = L.encode_uuids(gpu_uuids)
        directory = resolve_dir(channel_dir)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / CHANNEL_FILE
        lock = OwnerLock(directory / TRAINER_LOCK, create=True)
        try:
            lock.acquire(who="trainer", holder=_describe_owner(path))
            fill_lock = OwnerLock(directory / FILL_LOCK, create=True)
        except BaseException:
            lock.close()
            raise
        old = _open_previous(path)
        generation, next_id = (old[0] + 1, old[1]) if old else (1, 1)
        for stale in directory.glob(".channel.*.tmp"):
            stale.unlink(missing_ok=True)
        tmp = directory / f".channel.{os.getpid()}.tmp"
        size = L.file_size(ring_capacity)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)
            os.ftruncate(fd, size)
            now = time.monotonic_ns()
            header = L.HEADER_FIXED.pack(
                L.MAGIC, L.LAYOUT_VERSION, ring_capacity, size, generation, L.STATE_INITIALIZING, os.getpid(), 0, 0, now
            )
            os.pwrite(fd, header, 0)
            os.pwrite(fd, L.IDENTITY.pack(rank, stage_idx, num_stages, len(gpu_uuids)), L.OFF_IDENTITY)
            os.pwrite(fd, job_raw, L.OFF_JOB_NAME)
            os.pwrite(fd, uuid_raw, L.OFF_GPU_UUIDS)
            mapping = Mapping(path, fd, size=size)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            lock.close()
            fill_lock.close()
            raise
        mapping.q[L.Q_TRAINER_HEARTBEAT] = now
        mapping.d[L.I_CHANNEL_STATE] = L.STATE_READY
        os.rename(tmp, path)  # atomic: a reader sees the old file or the complete new one
        if old is not None:
            _supersede(old[2])
        return cls(mapping=mapping, lock=lock, fill_lock=fill_lock, next_id=next_id)

    # -- the hot path ---------------------------------------------------------------------------------------------
    def open_bubble(
        self, *, expected_duration_s: float, free_bytes: int, kind: BubbleKind | str, step: int, mb_idx: int = -1
    ) -> int:
        """Announce that this stage's device is idle from now for about ``expected_duration_s``; returns the
        bubble id. Costs a few microseconds, plus one FUTEX_WAKE when the fill sleeps waiting for a bubble."""
        code = KIND_CODE_BY_NAME.get(kind)
        if (
            code is None
            or self._open is not None
            or not 0.0 <= expected_duration_s <= _MAX_DURATION_S
            or free_bytes < 0
        ):
            self._refuse_open(expected_duration_s, free_bytes, kind)
        mm, q, seq, bid = self._mm, self._q, self._seq, self._next_id
        now = time.monotonic_ns()
        end = now + int(expected_duration_s * 1e9)
        q[L.Q_BUBBLE_SEQ] = seq + 1
        L.BUBBLE_DATA.pack_into(
            mm, L.OFF_BUBBLE_DATA, bid, L.BUBBLE_OPEN, code, now, end, free_bytes, step, mb_idx, 0, 0
        )
        q[L.Q_BUBBLE_SEQ] = seq + 2
        self._seq = seq + 2
        self._next_id = bid + 1
        self._open = (bid, code, now, end, free_bytes, step, mb_idx)
        if self._d[L.I_FILL_WAITING]:
            self._futex.wake()
        q[L.Q_TRAINER_HEARTBEAT] = now
        return bid

    def close_bubble(self, bubble_id: int) -> None:
        """The device is busy again: from now on the fill starts no more work in ``bubble_id``. No syscall."""
        o = self._open
        if o is None or o[0] != bubble_id:
            raise ValueError(f"close_bubble({bubble_id}): the open bubble is {o[0] if o else 'none'}")
        bid, code, open_ns, end, free_bytes, step, mb_idx = o
        mm, q, seq = self._mm, self._q, self._seq
        now = time.monotonic_ns()
        q[L.Q_BUBBLE_SEQ] = seq + 1
        L.BUBBLE_DATA.pack_into(
            mm, L.OFF_BUBBLE_DATA, bid, L.BUBBLE_CLOSED, code, open_ns, end, free_bytes, step, mb_idx, 0, now
        )
        q[L.Q_BUBBLE_SEQ] = seq + 2
        self._seq = seq + 2
        self._open = None
        p_off = L.RING_OFFSET + (bid % self._cap) * L.PRODUCER_ENTRY_BYTES
        q[p_off >> 3] = 0
        L.PRODUCER_ENTRY.pack_into(
            mm, p_off + 8, code, mb_idx, step, open_ns, end - open_ns, now - open_ns, free_bytes, 0
        )
        q[p_off >> 3] = bid

    def heartbeat(self) -> None:
        """Record that the trainer is making progress (``open_bubble`` does this too)."""
        self._q[L.Q_TRAINER_HEARTBEAT] = time.monotonic_ns()

    def publish_device(self, *, gpu_uuids: Sequence[str]) -> None:
        """Publish the UUIDs of the GPUs this trainer uses, so the fill selects the same device (at most 8)."""
        raw = L.encode_uuids(gpu_uuids)
        mm, seq = self._mm, self._device_seq
        self._q[L.Q_DEVICE_SEQ] = seq + 1
        self._d[L.I_GPU_COUNT] = len(gpu_uuids)
        mm[L.OFF_GPU_UUIDS : L.OFF_GPU_UUIDS + len(raw)] = raw
        self._q[L.Q_DEVICE_SEQ] = seq + 2
        self._device_seq = seq + 2

    # -- reading the fill's side (never waits) -----------------------------------------------------------------------
    def consumer_alive(self) -> bool:
        """Whether a fill executor is attached and alive (its lock is held; one fcntl, never waits)."""
        return self._fill_lock.held()

    def fill_floor_s(self) -> float:
        """The shortest bubble the fill says it can use now (0.0: it has no estimate, or no fill has said one)."""
        return float(self._q[L.Q_FILL_FLOOR]) / 1e9

    def fill_answer(self) -> FillAnswer | None:
        """The fill's answer block, or None when the fill is stuck mid-write (it died there, or is preempted)."""
        return self._m.read_answer()

    def history(self) -> list[BubbleRecord]:
        """The last ``ring_capacity`` closed bubbles, oldest first, with what the fill reported for each."""
        return self._m.history()

    def info(self) -> ChannelInfo:
        return self._m.info()

    @property
    def path(self) -> Path:
        return self._m.path

    @property
    def generation(self) -> int:
        return self._m.generation()

    def close(self) -> None:
        """Training ended: close an open bubble, mark the channel finished (the fill stops), release the lock."""
        if self._m.fd < 0:
            return
        if self._open is not None:
            self.close_bubble(self._open[0])
        _mark(self._m, L.STATE_FINISHED, self._futex)
        self._m.close()
        self._lock.close()
        self._fill_lock.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _refuse_open(self, expected_duration_s: float, free_bytes: int, kind: object) -> NoReturn:
        if self._open is not None:
            raise ValueError(f"open_bubble: bubble {self._open[0]} is still open; close_bubble({self._open[0]}) first")
        if KIND_CODE_BY_NAME.get(kind) is None:  # type: ignore[call-overload]
            raise ValueError(f"kind={kind!r} is not a bubble kind; use one of {sorted(KIND_CODE_BY_NAME)}")
        if not 0.0 <= expected_duration_s <= _MAX_DURATION_S:
            raise ValueError(f"expected_duration_s={expected_duration_s!r} must be within 0..{_MAX_DURATION_S:g} s")
        raise ValueError(f"free_bytes={free_bytes!r} must be ≥ 0")


def _describe_owner(path: Path) -> str:
    with contextlib.suppress(OSError, ChannelError):
        m = Mapping.open_existing(path)
        try:
            return f"pid {m.info().trainer_pid} in its PID namespace, generation {m.generation()}"
        finally:
            m.close()
    return "pid unknown"


def _open_previous(path: Path) -> tuple[int, int, Mapping] | None:
    """(generation, next bubble id, mapping) of the channel a previous trainer left, or None if none is readable."""
    try:
        m = Mapping.open_existing(path)
    except (OSError, ChannelError):
        return None  # absent, foreign or of another version: start afresh (the fill re-validates the new file)
    seq = m.u64(L.OFF_BUBBLE_SEQ)
    last = max([m.u64(L.OFF_BUBBLE_DATA)] + [r.id for r in m.history()])
    return m.generation(), last + 1 + (seq & 1), m  # an odd seq: the dead trainer was writing id last + 1


def _supersede(old: Mapping) -> None:
    """Tell a fill still attached to the replaced file to move: state superseded, seq bumped, waiter woken."""
    _mark(old, L.STATE_SUPERSEDED, Futex(old.base + L.OFF_BUBBLE_SEQ))
    old.close()


def _mark(m: Mapping, state: int, futex: Futex) -> None:
    m.d[L.I_CHANNEL_STATE] = state
    # +2 keeps the parity: a bubble left half-written (odd) by a dead trainer must never look complete.
    m.q[L.Q_BUBBLE_SEQ] += 2
    futex.wake()
