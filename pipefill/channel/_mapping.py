"""A channel file mapped into this process: validation on attach and the seqlock readers both sides share."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import time
from pathlib import Path

from pipefill.channel import layout as L
from pipefill.channel.errors import ChannelLayoutError, ChannelVersionError
from pipefill.channel.model import BubbleKind, BubbleRecord, ChannelInfo, FillAnswer, FillState

__all__ = ["Mapping", "read_seqlocked"]

_READ_TRIES = 64  # a writer holds a seqlock for about a microsecond; past this it was preempted or died


class Mapping:
    """A read-write shared mapping of one channel file. Keeps the file's inode to notice a replaced file."""

    def __init__(self, path: Path, fd: int, *, size: int) -> None:
        self.path = path
        self.fd = fd
        self.ino = os.fstat(fd).st_ino
        self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._buf = (ctypes.c_char * size).from_buffer(self.mm)  # for the futex word's address
        self.base = ctypes.addressof(self._buf)
        self.q = memoryview(self.mm).cast("Q")  # u64 words: one store or load each (see layout.Q_BUBBLE_SEQ)
        self.d = memoryview(self.mm).cast("I")  # u32 words
        self.ring_capacity: int = self.d[L.OFF_RING_CAPACITY >> 2]

    @classmethod
    def open_existing(cls, path: Path) -> Mapping:
        """Map and validate an existing channel file; ChannelLayoutError (or ChannelVersionError) when it is wrong."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = validate(path, fd)
            return cls(path, fd, size=size)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        if self.fd < 0:
            return
        self.q.release()
        self.d.release()
        del self._buf
        self.mm.close()
        os.close(self.fd)
        self.fd = -1

    # -- fields -------------------------------------------------------------------------------------------------
    def u32(self, offset: int) -> int:
        return int(self.d[offset >> 2])

    def u64(self, offset: int) -> int:
        return int(self.q[offset >> 3])

    def generation(self) -> int:
        return self.u64(L.OFF_GENERATION)

    def channel_state(self) -> int:
        return self.u32(L.OFF_CHANNEL_STATE)

    def read_bubble(self) -> tuple[int, tuple[int, ...]] | None:
        """(seq, bubble fields) from one consistent snapshot; None when the writer stays mid-write."""
        return read_seqlocked(self, L.Q_BUBBLE_SEQ, L.BUBBLE_DATA, L.OFF_BUBBLE_DATA)

    def read_answer(self) -> FillAnswer | None:
        snap = read_seqlocked(self, L.Q_ANSWER_SEQ, L.ANSWER_DATA, L.OFF_ANSWER_DATA)
        if snap is None:
            return None
        bid, state, _, *rest = snap[1]
        return FillAnswer(bid, FillState(state) if state in (0, 1, 2) else FillState.IDLE, *rest)

    def info(self) -> ChannelInfo:
        fixed = L.HEADER_FIXED.unpack_from(self.mm, 0)
        identity: tuple[int, ...] = (0, 0, 0, 0)
        uuids = b""
        for _ in range(_READ_TRIES):  # device fields change under device_seq
            s1 = self.u64(L.OFF_DEVICE_SEQ)
            identity = L.IDENTITY.unpack_from(self.mm, L.OFF_IDENTITY)
            uuids = bytes(self.mm[L.OFF_GPU_UUIDS : L.OFF_GPU_UUIDS + L.MAX_GPUS * L.UUID_BYTES])
            if not s1 & 1 and self.u64(L.OFF_DEVICE_SEQ) == s1:
                break
            time.sleep(0)
        job = bytes(self.mm[L.OFF_JOB_NAME : L.OFF_JOB_NAME + L.JOB_NAME_BYTES]).rstrip(b"\0")
        return ChannelInfo(
            path=str(self.path),
            layout_version=fixed[1],
            generation=fixed[4],
            ring_capacity=fixed[2],
            job_name=job.decode("utf-8", "replace"),
            rank=identity[0],
            stage_idx=identity[1],
            num_stages=identity[2],
            gpu_uuids=L.decode_uuids(uuids, identity[3]),
            trainer_pid=fixed[6],
            fill_pid=self.u32(L.OFF_FILL_PID),
            created_ns=fixed[9],
            trainer_heartbeat_ns=self.u64(L.OFF_TRAINER_HEARTBEAT),
            fill_heartbeat_ns=self.u64(L.OFF_FILL_HEARTBEAT),
        )

    def history(self) -> list[BubbleRecord]:
        """The closed bubbles still in the ring, oldest first, joined with the fill's ring entries by bubble id."""
        out = []
        for slot in range(self.ring_capacity):
            p_off, f_off = L.ring_offsets(self.ring_capacity, slot)
            p_id = self.u64(p_off)
            if p_id == 0:
                continue
            kind, mb_idx, step, open_ns, predicted_ns, actual_ns, free_bytes, _ = L.PRODUCER_ENTRY.unpack_from(
                self.mm, p_off + 8
            )
            if self.u64(p_off) != p_id:
                continue  # rewritten while we read it
            filled: tuple[int, ...] | None = None
            if self.u64(f_off) == p_id:
                got = L.FILL_ENTRY.unpack_from(self.mm, f_off + 8)
                filled = got if self.u64(f_off) == p_id else None
            out.append(
                BubbleRecord(
                    id=p_id,
                    kind=BubbleKind.from_code(kind),
                    step=step,
                    mb_idx=mb_idx,
                    open_ns=open_ns,
                    predicted_ns=predicted_ns,
                    actual_ns=actual_ns,
                    free_bytes=free_bytes,
                    filled_ns=filled[0] if filled else None,
                    overrun_ns=filled[1] if filled else None,
                    work=filled[2] if filled else None,
                )
            )
        return sorted(out, key=lambda r: r.id)


def read_seqlocked(m: Mapping, seq_ix: int, data: struct.Struct, data_off: int) -> tuple[int, tuple[int, ...]] | None:
    """One consistent snapshot of a seqlocked block: (seq, fields), or None if it stays odd or keeps changing."""
    q, mm = m.q, m.mm
    for attempt in range(_READ_TRIES):
        s1 = q[seq_ix]
        if not s1 & 1:
            fields = data.unpack_from(mm, data_off)
            if q[seq_ix] == s1:
                return s1, fields
        if attempt >= 8:
            time.sleep(0)  # let a preempted writer on this core finish
    return None


def validate(path: Path, fd: int) -> int:
    """Check magic, version and sizes of an open channel file; returns its size."""
    size = os.fstat(fd).st_size
    head = os.pread(fd, 24, 0)
    if len(head) < 8 or head[:8] != L.MAGIC:
        if len(head) < 8 and L.MAGIC.startswith(head):
            raise ChannelLayoutError(
                f"channel file {path} is truncated: {size} bytes; a channel starts with {L.MAGIC!r}"
            )
        raise ChannelLayoutError(
            f"{path} is not a PipeFill bubble channel: it starts with {head[:8]!r}, expected magic {L.MAGIC!r}; "
            "remove it or point PIPEFILL_CHANNEL_DIR at the directory the trainer writes"
        )
    if len(head) < 24:
        raise ChannelLayoutError(f"channel file {path} is truncated: {size} bytes, its header needs {L.RING_OFFSET}")
    version = L.U32.unpack_from(head, L.OFF_VERSION)[0]
    if version != L.LAYOUT_VERSION:
        raise ChannelVersionError(str(path), expected=L.LAYOUT_VERSION, found=version)
    capacity = L.U32.unpack_from(head, L.OFF_RING_CAPACITY)[0]
    total = L.U64.unpack_from(head, L.OFF_TOTAL_SIZE)[0]
    if not 1 <= capacity <= L.MAX_RING_CAPACITY or total != L.file_size(capacity):
        raise ChannelLayoutError(
            f"channel file {path}: ring_capacity {capacity} and total_size {total} disagree "
            f"(rule: 1 ≤ ring_capacity ≤ {L.MAX_RING_CAPACITY}, total_size = 2048 + 96 × ring_capacity); "
            "the file is corrupt: restart the trainer to re-create it"
        )
    if size < total:
        raise ChannelLayoutError(f"channel file {path} is truncated: {size} bytes, its header says {total}")
    return int(total)
