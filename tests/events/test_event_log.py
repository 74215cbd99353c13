"""The event log's one writer and one reader: every record round-trips, both clocks are stamped, torn and foreign
lines are skipped, a tail reads each complete line once."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from pipefill.events import (
    EVENT_TYPES,
    ActionEvent,
    AssignEvent,
    BubbleEvent,
    CommitEvent,
    Event,
    EventTail,
    EventWriter,
    ExitEvent,
    FillEvent,
    HoldEvent,
    JobEvent,
    MeasureEvent,
    ProfileEvent,
    RestartEvent,
    SliceEvent,
    StartEvent,
    StartupEvent,
    StepEvent,
    WorkEvent,
    read_events,
)

SAMPLES: list[Event] = [
    StepEvent(step=3, loss=2.5, step_s=0.1, tokens_per_s=1000.0, start_ns=10),
    ActionEvent(step=3, idx=0, action="0F0", start_ns=10, end_ns=20),
    BubbleEvent(step=3, idx=1, kind="steady", start_ns=20, end_ns=30, predicted_s=1e-5, announced=True),
    RestartEvent(step=2, checkpoint="/ckpt"),
    StartEvent(device="cpu", cpus=[0], memory_budget_bytes=1 << 20, guard_s=5e-4, training_job="demo", rank=1),
    JobEvent(job="embed", phase="Running", committed=0, total=100),
    SliceEvent(job="embed", start=0, end=50, phase="claimed", position=0, adopted=0, removed=1),
    StartupEvent(
        job="embed", slice=[0, 50], start_ns=1, end_ns=9, open_s=5e-9, warm_s=3e-9, batch_sizes=[1, 4], warm_before=[1]
    ),
    ProfileEvent(job="embed", cached=False, device="cpu", points=[{"batch_size": 4, "step_s": 0.01, "peak_bytes": 9}]),
    MeasureEvent(job="embed", batch_size=4, start_ns=3, end_ns=40, step_s=3.5e-8),
    AssignEvent(classes={"12.500ms": "embed"}, jobs=["embed"]),
    FillEvent(
        id=7,
        kind="steady",
        open_ns=100,
        expected_end_ns=200,
        woke_ns=110,
        yielded_ns=190,
        free_bytes=1 << 20,
        job="embed",
        batch_size=4,
        steps=2,
        items=8,
        used_s=8e-8,
        overrun_s=0.0,
        stop="time",
        spans_ns=[[120, 150], [150, 180]],
        step_trace=[[25, 29, 0, 1], [12, 30, 1, 0]],
        step=3,
        batch_sizes=[4, 3],
        commits_ns=[[181, 189]],
        deadline_ns=195,
        handoff="embed-2",
        handoff_items=4,
    ),
    HoldEvent(held=True),
    CommitEvent(job="embed", end=8, slice=[0, 50], position=8, bytes=512, commit_s=1e-4, at="shutdown"),
    WorkEvent(job="embed", start_ns=1, end_ns=2, steps=3, items=12),
    ExitEvent(reason="trainer gone"),
]


def _payload(e: Event) -> dict[str, object]:
    return {k: v for k, v in dataclasses.asdict(e).items() if k not in ("wall_s", "mono_ns", "pid")}


def test_every_record_round_trips_stamped_with_both_clocks(tmp_path: Path) -> None:
    assert {type(e) for e in SAMPLES} == set(EVENT_TYPES.values())  # the samples cover every record
    path = tmp_path / "sub" / "events.jsonl"  # the writer creates the directory
    wall0, mono0 = time.time(), time.monotonic_ns()
    with EventWriter(path) as log:
        for e in SAMPLES:
            log.write(e)
    wall1, mono1 = time.time(), time.monotonic_ns()
    got = read_events(path)
    assert [_payload(e) for e in got] == [_payload(e) for e in SAMPLES]
    for e in got:
        assert wall0 - 1e-6 <= e.wall_s <= wall1 + 1e-6 and mono0 <= e.mono_ns <= mono1 and e.pid == os.getpid()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["event"] for line in lines] == [e.EVENT for e in SAMPLES]
    assert "message" not in lines[5]  # unset optional fields are left out of the line


def test_wall_of_puts_a_monotonic_time_of_the_record_on_the_wall_clock() -> None:
    e = StepEvent(
        step=0, loss=0.0, step_s=0.5, tokens_per_s=0.0, start_ns=1_000_000_000, wall_s=100.0, mono_ns=3_000_000_000
    )
    assert e.wall_of(e.start_ns) == 98.0


def test_the_trainer_writer_buffers_until_flush(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventWriter(path, flush_each=False)
    log.write(SAMPLES[0])
    assert read_events(path) == []
    log.flush()
    assert len(read_events(path)) == 1
    log.close()
    log.write(SAMPLES[0])  # closed: records nothing, raises nothing
    assert not log.enabled and len(read_events(path)) == 1


def test_foreign_torn_and_incomplete_lines_are_skipped_and_unknown_fields_ignored(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    exit_line = {"event": "exit", "wall_s": 1.0, "mono_ns": 2, "pid": 3, "reason": "SIGTERM", "added_later": 1}
    path.write_text(
        "\n".join(
            [
                json.dumps({"event": "from-a-newer-release", "x": 1}),
                json.dumps({"event": "step", "step": 1}),  # fields missing
                json.dumps(["not", "a", "record"]),
                json.dumps(exit_line),
                '{"event": "exit", "reas',  # torn by a crash
            ]
        )
    )
    assert read_events(path) == [ExitEvent(reason="SIGTERM", wall_s=1.0, mono_ns=2, pid=3)]
    assert read_events(tmp_path / "absent.jsonl") == []


def _line(reason: str) -> bytes:
    return json.dumps({"event": "exit", "reason": reason}).encode() + b"\n"


def _reasons(records: list[Event]) -> list[str]:
    return [e.reason for e in records if isinstance(e, ExitEvent)]


def test_tail_returns_each_complete_line_once_and_holds_a_partial_last_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    tail = EventTail(path)
    assert tail.read() == []  # not there yet
    path.write_bytes(_line("1") + _line("2"))
    assert _reasons(tail.read()) == ["1", "2"]
    three = _line("3")
    with path.open("ab") as fh:
        fh.write(three[:10])
    assert tail.read() == []  # a line being written waits for its newline
    with path.open("ab") as fh:
        fh.write(three[10:] + _line("4"))
    assert _reasons(tail.read()) == ["3", "4"]
    with path.open("r+b") as fh:  # change bytes already read: a tail reads on from its offset, never re-reads
        fh.write(_line("9")[:-1])
    with path.open("ab") as fh:
        fh.write(_line("5") + _line("6")[:-1])
    assert _reasons(tail.read()) == ["5"]
    assert _reasons(tail.read(final=True)) == ["6"]  # the run is over: a last line that parses counts
    replaced = tmp_path / "new.jsonl"
    replaced.write_bytes(_line("b1"))
    os.replace(replaced, path)  # a new file (a fresh run into the same place) is read from its start
    assert _reasons(tail.read()) == ["b1"]
    with path.open("ab") as fh:
        fh.write(b'{"torn\n' + _line("b2"))
    assert _reasons(tail.read()) == ["b2"]  # a torn line is skipped
