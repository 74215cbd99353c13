"""The byte layout: the table in docs/channel.md is the table in the code, and the fields are sound."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from pipefill.channel import layout as L

DOC = Path(__file__).resolve().parents[2] / "docs" / "channel.md"
FIXED = ("header", "bubble", "wait", "answer")


def test_docs_table_is_the_code_table() -> None:
    """Every row of the layout tables in docs/channel.md equals a field of layout.FIELDS, in order, and back."""
    rows = []
    for line in DOC.read_text().splitlines():
        m = re.match(
            r"\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*`(\w+)`\s*\|\s*(\S+)\s*\|\s*([^|]+?)\s*\|\s*(trainer|fill)\s*\|", line
        )
        if m:
            rows.append((int(m[1]), int(m[2]), m[3], m[4], m[5], m[6]))
    want = [(f.offset, f.size, f.name, f.ctype, f.unit, f.writer) for f in L.FIELDS]
    assert rows == want


def test_fixed_blocks_are_aligned_disjoint_and_before_the_rings() -> None:
    fields = [f for f in L.FIELDS if f.block in FIXED]
    for f in fields:
        assert f.offset % min(f.size, 8) == 0, f"{f.name} at {f.offset} is not aligned"
    spans = sorted((f.offset, f.offset + f.size, f.name) for f in fields)
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        assert end <= start, f"{a} overlaps {b}"
    assert spans[-1][1] <= L.RING_OFFSET
    # the trainer's and the fill's hot words live on different 64-byte cache lines
    line = {f.name: f.offset // 64 for f in fields}
    assert len({line["bubble_seq"], line["fill_waiting"], line["answer_seq"]}) == 3


@pytest.mark.parametrize(
    ("block", "size"), [("producer ring entry", L.PRODUCER_ENTRY_BYTES), ("fill ring entry", L.FILL_ENTRY_BYTES)]
)
def test_ring_entries_fill_their_slot_exactly(block: str, size: int) -> None:
    fields = [f for f in L.FIELDS if f.block == block]
    assert fields[0].offset == 0 and fields[0].name == "entry_id"
    assert sum(f.size for f in fields) == size == fields[-1].offset + fields[-1].size


def test_every_field_has_one_writer_and_the_header_is_the_trainers() -> None:
    assert {f.writer for f in L.FIELDS} == {"trainer", "fill"}
    fill_fields = {f.name for f in L.FIELDS if f.writer == "fill" and f.block in FIXED}
    assert fill_fields == {
        "fill_pid", "fill_heartbeat_ns", "fill_floor_ns", "fill_waiting", "answer_seq", "answer_bubble_id", "fill_state",
        "reserved_1236", "yielded_ns", "used_ns", "overrun_ns", "work", "acked_total", "used_total_ns",
        "overrun_total_ns", "work_total",
    }  # fmt: skip


def test_sizes_and_ring_slots() -> None:
    assert L.file_size(64) == 2048 + 64 * 96 == 8192
    assert L.ring_offsets(64, 1) == (2048 + 64, 2048 + 64 * 64 + 32)
    assert L.ring_offsets(64, 64) == L.ring_offsets(64, 0)
    assert L.BUBBLE_DATA.size == 1096 - 1032


def test_uuid_and_job_name_encoding_refuse_what_does_not_fit() -> None:
    raw = L.encode_uuids(["GPU-a", "MIG-b"])
    assert len(raw) == 512 and L.decode_uuids(raw, 2) == ("GPU-a", "MIG-b")
    with pytest.raises(ValueError, match="at most 8"):
        L.encode_uuids(["GPU-x"] * 9)
    with pytest.raises(ValueError, match="ASCII"):
        L.encode_uuids(["GPU-" + "x" * 60])
    with pytest.raises(ValueError, match="ASCII"):
        L.encode_uuids(["GPU-ü"])
    with pytest.raises(ValueError, match="at most 63"):
        L.encode_job_name("j" * 64)
