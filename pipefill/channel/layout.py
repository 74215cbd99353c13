"""The byte layout of the bubble channel file, version 1: one table of fields, the single source of truth.

``docs/channel.md`` prints the same table (a test keeps the two equal). Every field is little-endian and naturally
aligned, and every field is written by exactly one side. Structs are built from the table in *native* format on
little-endian hosts; they pack multi-field blocks inside a seqlock's odd window. Single words (seqs, flags, states,
heartbeats) go through memoryview casts at the ``Q_*`` / ``I_*`` indexes below: one aligned store each.
"""

from __future__ import annotations

import itertools
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from pipefill.channel.errors import ChannelError

__all__ = [
    "FIELDS",
    "LAYOUT_VERSION",
    "MAGIC",
    "Field",
    "file_size",
    "ring_offsets",
]

MAGIC = b"PIPEFILL"
"""The first 8 bytes of every channel file."""
LAYOUT_VERSION = 1
"""Bumped on any change of this table that a reader of the version before would misread; both sides refuse a file of
another version. A field added where the file was all zero bytes, whose 0 means what its absence meant, is no such
change (``fill_floor_ns``: 0 is "no estimate", what a fill of before said by writing nothing)."""

MAX_GPUS = 8
UUID_BYTES = 64
JOB_NAME_BYTES = 64
DEFAULT_RING_CAPACITY = 64
"""Entries in the ring of recent bubbles (64 bubbles: a few steps of a deep pipeline)."""
MAX_RING_CAPACITY = 4096
RING_OFFSET = 2048
PRODUCER_ENTRY_BYTES = 64
FILL_ENTRY_BYTES = 32

# channel_state
STATE_INITIALIZING, STATE_READY, STATE_FINISHED, STATE_SUPERSEDED = 0, 1, 2, 3
# bubble_state
BUBBLE_NONE, BUBBLE_OPEN, BUBBLE_CLOSED = 0, 1, 2
# fill_state
FILL_IDLE, FILL_RUNNING, FILL_YIELDED = 0, 1, 2

_CODES = {"u32": "I", "i32": "i", "u64": "Q", "i64": "q"}


@dataclass(frozen=True)
class Field:
    """One field of the layout. ``offset`` is absolute, except in the two ring blocks (relative to the entry)."""

    block: str
    name: str
    offset: int
    ctype: str  # u32 | i32 | u64 | i64 | char[N]
    unit: str
    writer: str  # trainer | fill
    meaning: str

    @property
    def size(self) -> int:
        if self.ctype.startswith("char["):
            return int(self.ctype[5:-1])
        return struct.calcsize(_CODES[self.ctype])

    @property
    def code(self) -> str:
        return f"{self.size}s" if self.ctype.startswith("char[") else _CODES[self.ctype]


_T, _F = "trainer", "fill"
_H, _B, _W, _A, _PR, _FR = "header", "bubble", "wait", "answer", "producer ring entry", "fill ring entry"
FIELDS: tuple[Field, ...] = (
    Field(_H, "magic", 0, "char[8]", "-", _T, 'ASCII "PIPEFILL"'),
    Field(_H, "layout_version", 8, "u32", "-", _T, "1 for this table"),
    Field(_H, "ring_capacity", 12, "u32", "entries", _T, "N, entries in each ring (1..4096)"),
    Field(_H, "total_size", 16, "u64", "bytes", _T, "file size: 2048 + 96 × N"),
    Field(_H, "generation", 24, "u64", "-", _T, "trainer initializations of this channel directory, from 1"),
    Field(_H, "channel_state", 32, "u32", "enum", _T, "0 initializing, 1 ready, 2 finished, 3 superseded"),
    Field(_H, "trainer_pid", 36, "u32", "-", _T, "trainer pid in its own PID namespace (diagnostics only)"),
    Field(_H, "fill_pid", 40, "u32", "-", _F, "fill pid in its own PID namespace (diagnostics only)"),
    Field(_H, "reserved_44", 44, "u32", "-", _T, "0"),
    Field(_H, "created_ns", 48, "u64", "ns", _T, "CLOCK_MONOTONIC when the trainer initialized the file"),
    Field(_H, "trainer_heartbeat_ns", 56, "u64", "ns", _T, "CLOCK_MONOTONIC of the trainer's last heartbeat"),
    Field(_H, "fill_heartbeat_ns", 64, "u64", "ns", _F, "CLOCK_MONOTONIC of the fill's last heartbeat"),
    Field(_H, "device_seq", 72, "u64", "-", _T, "seqlock over gpu_count and gpu_uuids (odd while writing)"),
    Field(_H, "rank", 80, "u32", "-", _T, "global rank of the trainer"),
    Field(_H, "stage_idx", 84, "u32", "-", _T, "pipeline stage (the first, when a rank holds several)"),
    Field(_H, "num_stages", 88, "u32", "-", _T, "pipeline stages in the job"),
    Field(_H, "gpu_count", 92, "u32", "-", _T, "valid entries of gpu_uuids (0..8)"),
    Field(_H, "job_name", 96, "char[64]", "UTF-8", _T, "job name, NUL-padded"),
    Field(_H, "gpu_uuids", 160, "char[512]", "ASCII", _T, '8 × 64 bytes, NUL-padded, e.g. "GPU-5f2c…"'),
    Field(_H, "fill_floor_ns", 672, "u64", "ns", _F, "shortest bubble the fill can use now; 0: no estimate"),
    Field(_B, "bubble_seq", 1024, "u64", "-", _T, "seqlock, odd while writing; low 32 bits are the futex word"),
    Field(_B, "bubble_id", 1032, "u64", "-", _T, "current bubble, monotonic from 1, continued over restarts"),
    Field(_B, "bubble_state", 1040, "u32", "enum", _T, "0 none yet, 1 open, 2 closed"),
    Field(_B, "bubble_kind", 1044, "u32", "enum", _T, "1 warm-up, 2 steady, 3 cool-down, 4 end-of-step"),
    Field(_B, "open_ns", 1048, "u64", "ns", _T, "CLOCK_MONOTONIC when the bubble opened"),
    Field(_B, "expected_end_ns", 1056, "u64", "ns", _T, "CLOCK_MONOTONIC when the trainer expects to resume"),
    Field(_B, "free_bytes", 1064, "u64", "bytes", _T, "device memory free for the fill during this bubble"),
    Field(_B, "step", 1072, "i64", "-", _T, "training step"),
    Field(_B, "mb_idx", 1080, "i32", "-", _T, "microbatch whose wait this is; -1 for none (end-of-step)"),
    Field(_B, "reserved_1084", 1084, "u32", "-", _T, "0"),
    Field(_B, "close_ns", 1088, "u64", "ns", _T, "CLOCK_MONOTONIC when the bubble closed; 0 while open"),
    Field(_W, "fill_waiting", 1152, "u32", "-", _F, "1 while the fill is (about to be) asleep on the futex word"),
    Field(_A, "answer_seq", 1216, "u64", "-", _F, "seqlock over this block, odd while writing"),
    Field(_A, "answer_bubble_id", 1224, "u64", "-", _F, "bubble the fill runs in / last acknowledged"),
    Field(_A, "fill_state", 1232, "u32", "enum", _F, "0 idle, 1 running, 2 yielded"),
    Field(_A, "reserved_1236", 1236, "u32", "-", _F, "0"),
    Field(_A, "yielded_ns", 1240, "u64", "ns", _F, "CLOCK_MONOTONIC when the fill yielded that bubble"),
    Field(_A, "used_ns", 1248, "u64", "ns", _F, "device-busy time the fill used in that bubble"),
    Field(_A, "overrun_ns", 1256, "u64", "ns", _F, "how far the fill ran past expected_end_ns"),
    Field(_A, "work", 1264, "u64", "units", _F, "work done in that bubble (fill-defined: samples, steps)"),
    Field(_A, "acked_total", 1272, "u64", "bubbles", _F, "bubbles acknowledged since the fill attached"),
    Field(_A, "used_total_ns", 1280, "u64", "ns", _F, "sum of used_ns"),
    Field(_A, "overrun_total_ns", 1288, "u64", "ns", _F, "sum of overrun_ns"),
    Field(_A, "work_total", 1296, "u64", "units", _F, "sum of work"),
    Field(_PR, "entry_id", 0, "u64", "-", _T, "bubble id; 0 while the entry is written (entry seqlock)"),
    Field(_PR, "kind", 8, "u32", "enum", _T, "as bubble_kind"),
    Field(_PR, "mb_idx", 12, "i32", "-", _T, "as mb_idx"),
    Field(_PR, "step", 16, "i64", "-", _T, "as step"),
    Field(_PR, "open_ns", 24, "u64", "ns", _T, "as open_ns"),
    Field(_PR, "predicted_ns", 32, "u64", "ns", _T, "expected_end_ns − open_ns"),
    Field(_PR, "actual_ns", 40, "u64", "ns", _T, "close_ns − open_ns"),
    Field(_PR, "free_bytes", 48, "u64", "bytes", _T, "as free_bytes"),
    Field(_PR, "reserved_56", 56, "u64", "-", _T, "0"),
    Field(_FR, "entry_id", 0, "u64", "-", _F, "bubble id; 0 while the entry is written (entry seqlock)"),
    Field(_FR, "filled_ns", 8, "u64", "ns", _F, "as used_ns"),
    Field(_FR, "overrun_ns", 16, "u64", "ns", _F, "as overrun_ns"),
    Field(_FR, "work", 24, "u64", "units", _F, "as work"),
)


def _field(block: str, name: str) -> Field:
    return next(f for f in FIELDS if f.block == block and f.name == name)


def _struct(block: str, first: str, last: str) -> struct.Struct:
    """A struct over the consecutive fields ``first..last`` of ``block``; fails at import when the table has a gap."""
    fields = [f for f in FIELDS if f.block == block]
    names = [f.name for f in fields]
    chosen = fields[names.index(first) : names.index(last) + 1]
    for a, b in itertools.pairwise(chosen):
        if a.offset + a.size != b.offset:
            raise RuntimeError(f"layout table: {b.name} at {b.offset} does not follow {a.name} at {a.offset}")
    fmt = "@" + "".join(f.code for f in chosen)
    s = struct.Struct(fmt)
    if s.size != chosen[-1].offset + chosen[-1].size - chosen[0].offset:
        raise RuntimeError(f"layout table: {fmt} is {s.size} bytes, the table says otherwise")
    return s


if sys.byteorder != "little":  # pragma: no cover - no big-endian host runs CUDA
    raise ChannelError("the bubble channel layout is little-endian and this host is big-endian: run on x86-64 or arm64")

# Structs used on the hot paths, with the offsets they are packed at.
U32 = struct.Struct("@I")
U64 = struct.Struct("@Q")
HEADER_FIXED = _struct(_H, "magic", "created_ns")  # written once, at initialization
IDENTITY = _struct(_H, "rank", "gpu_count")
BUBBLE_DATA = _struct(_B, "bubble_id", "close_ns")  # after bubble_seq
ANSWER_DATA = _struct(_A, "answer_bubble_id", "work_total")  # after answer_seq
PRODUCER_ENTRY = _struct(_PR, "kind", "reserved_56")  # after entry_id
FILL_ENTRY = _struct(_FR, "filled_ns", "work")  # after entry_id

OFF_MAGIC = _field(_H, "magic").offset
OFF_VERSION = _field(_H, "layout_version").offset
OFF_RING_CAPACITY = _field(_H, "ring_capacity").offset
OFF_TOTAL_SIZE = _field(_H, "total_size").offset
OFF_GENERATION = _field(_H, "generation").offset
OFF_CHANNEL_STATE = _field(_H, "channel_state").offset
OFF_TRAINER_PID = _field(_H, "trainer_pid").offset
OFF_FILL_PID = _field(_H, "fill_pid").offset
OFF_TRAINER_HEARTBEAT = _field(_H, "trainer_heartbeat_ns").offset
OFF_FILL_HEARTBEAT = _field(_H, "fill_heartbeat_ns").offset
OFF_DEVICE_SEQ = _field(_H, "device_seq").offset
OFF_IDENTITY = _field(_H, "rank").offset
OFF_GPU_COUNT = _field(_H, "gpu_count").offset
OFF_JOB_NAME = _field(_H, "job_name").offset
OFF_FILL_FLOOR = _field(_H, "fill_floor_ns").offset
OFF_GPU_UUIDS = _field(_H, "gpu_uuids").offset
OFF_BUBBLE_SEQ = _field(_B, "bubble_seq").offset
OFF_BUBBLE_DATA = _field(_B, "bubble_id").offset
OFF_FILL_WAITING = _field(_W, "fill_waiting").offset
OFF_ANSWER_SEQ = _field(_A, "answer_seq").offset
OFF_ANSWER_DATA = _field(_A, "answer_bubble_id").offset
MIN_FILE_SIZE = RING_OFFSET + PRODUCER_ENTRY_BYTES + FILL_ENTRY_BYTES

# Single words are stored through ``memoryview(mm).cast("Q")`` / ``.cast("I")`` at these indexes: one aligned store
# each. Never ``Struct.pack_into`` for them: it zero-fills the target before writing the value, and a reader that
# sees that transient 0 in a seq word twice would accept a half-written block.
Q_BUBBLE_SEQ = OFF_BUBBLE_SEQ // 8
Q_ANSWER_SEQ = OFF_ANSWER_SEQ // 8
Q_DEVICE_SEQ = OFF_DEVICE_SEQ // 8
Q_TRAINER_HEARTBEAT = OFF_TRAINER_HEARTBEAT // 8
Q_FILL_HEARTBEAT = OFF_FILL_HEARTBEAT // 8
Q_FILL_FLOOR = OFF_FILL_FLOOR // 8
I_CHANNEL_STATE = OFF_CHANNEL_STATE // 4
I_FILL_WAITING = OFF_FILL_WAITING // 4
I_FILL_PID = OFF_FILL_PID // 4
I_GPU_COUNT = OFF_GPU_COUNT // 4


def file_size(ring_capacity: int) -> int:
    """Bytes of a channel file whose rings hold ``ring_capacity`` entries each."""
    return RING_OFFSET + ring_capacity * (PRODUCER_ENTRY_BYTES + FILL_ENTRY_BYTES)


def ring_offsets(ring_capacity: int, bubble_id: int) -> tuple[int, int]:
    """Absolute offsets of the producer and fill ring entries of ``bubble_id`` (slot ``bubble_id mod N``)."""
    slot = bubble_id % ring_capacity
    producer = RING_OFFSET + slot * PRODUCER_ENTRY_BYTES
    return producer, RING_OFFSET + ring_capacity * PRODUCER_ENTRY_BYTES + slot * FILL_ENTRY_BYTES


def encode_uuids(gpu_uuids: Sequence[str]) -> bytes:
    """The gpu_uuids field; a clear error for too many or too long UUIDs."""
    if len(gpu_uuids) > MAX_GPUS:
        raise ValueError(f"gpu_uuids has {len(gpu_uuids)} entries, the channel holds at most {MAX_GPUS}")
    out = b""
    for u in gpu_uuids:
        raw = u.encode("ascii", errors="strict") if u.isascii() else b""
        if not raw or len(raw) >= UUID_BYTES:
            raise ValueError(f"GPU UUID {u!r} must be 1..{UUID_BYTES - 1} ASCII characters (e.g. 'GPU-5f2c…')")
        out += raw.ljust(UUID_BYTES, b"\0")
    return out.ljust(MAX_GPUS * UUID_BYTES, b"\0")


def decode_uuids(raw: bytes, count: int) -> tuple[str, ...]:
    count = min(count, MAX_GPUS)
    return tuple(
        raw[i * UUID_BYTES : (i + 1) * UUID_BYTES].rstrip(b"\0").decode("ascii", "replace") for i in range(count)
    )


def encode_job_name(job_name: str) -> bytes:
    raw = job_name.encode("utf-8")
    if len(raw) >= JOB_NAME_BYTES:
        raise ValueError(f"job_name {job_name!r} is {len(raw)} bytes in UTF-8, the channel holds at most 63")
    return raw
