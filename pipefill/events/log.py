"""The one writer and the one reader of event logs (JSON lines; the format is in ``docs/events.md``).

The writer stamps each record with both clocks and appends it as one line. The trainer buffers its lines and flushes
once per step, off the step's critical path; the fill executor flushes every line, so a crash loses at most the line
being written. Readers take complete lines only: a torn last line (a writer mid-line, or a crash) is skipped, or, for
:class:`EventTail`, waited for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from pipefill.events.records import EVENT_TYPES, Event

__all__ = ["FILL_EVENTS", "TRAINER_EVENTS", "EventTail", "EventWriter", "parse_event", "read_events"]

TRAINER_EVENTS = "events.jsonl"
"""The trainer's event log, in its ``PIPEFILL_OUT_DIR``."""
FILL_EVENTS = "fill-events.jsonl"
"""The fill executor's event log, in its ``PIPEFILL_OUT_DIR``."""

_STAMP = frozenset(f.name for f in dataclasses.fields(Event))
_PAYLOAD = {cls: tuple(f.name for f in dataclasses.fields(cls) if f.name not in _STAMP) for cls in EVENT_TYPES.values()}
_ACCEPTED = {cls: frozenset(f.name for f in dataclasses.fields(cls)) for cls in EVENT_TYPES.values()}
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
"""One encoder for every line: ``json.dumps`` with ``separators`` builds a new encoder at each call (3–4 µs of a
record's ~10; a trainer writes about 20 records a step)."""


class EventWriter:
    """Appends records to ``path`` (created with its directory); with ``path`` None it records nothing.

    ``flush_each``: flush after every record (the fill executor); else lines wait in a 64 KiB buffer until
    :meth:`flush` (the trainer, once per step).
    """

    def __init__(self, path: Path | None, *, flush_each: bool = True) -> None:
        self.path = path
        self._fh: IO[str] | None = None
        self._pid = os.getpid()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            buffering = 1 if flush_each else 1 << 16  # 1: line-buffered
            self._fh = open(path, "a", encoding="utf-8", buffering=buffering)  # noqa: SIM115 - closed in close()

    @property
    def enabled(self) -> bool:
        return self._fh is not None

    def write(self, record: Event) -> None:
        """Append ``record``, stamped now (its own stamp, if any, is replaced)."""
        if self._fh is None:
            return
        line: dict[str, Any] = {
            "event": record.EVENT,
            "wall_s": time.time(),
            "mono_ns": time.monotonic_ns(),
            "pid": self._pid,
        }
        for name in _PAYLOAD[type(record)]:
            value = getattr(record, name)
            if value is not None:
                line[name] = value
        self._fh.write(_ENCODE(line) + "\n")

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def parse_event(obj: object) -> Event | None:
    """The record of one decoded line; None for an event this release does not know, or a line missing a field.

    Fields this release does not know are ignored, so a newer writer's log still reads.
    """
    if not isinstance(obj, dict):
        return None
    cls = EVENT_TYPES.get(str(obj.get("event")))
    if cls is None:
        return None
    accepted = _ACCEPTED[cls]
    try:
        return cls(**{k: v for k, v in obj.items() if k in accepted})
    except TypeError:  # a required field is missing: not a record of this format
        return None


def _parse_lines(lines: list[bytes]) -> list[Event]:
    out = []
    for line in lines:
        try:
            record = parse_event(json.loads(line.decode("utf-8", errors="replace")))
        except json.JSONDecodeError:
            continue  # an empty line, or a torn one
        if record is not None:
            out.append(record)
    return out


class EventTail:
    """The records appended to a log since the last read, found by byte offset (never re-reading).

    A partial last line (a writer mid-line, or a torn line after a crash) waits until its newline arrives;
    ``read(final=True)`` takes it too when it parses. A file that shrank or was replaced is read again from its start.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0  # bytes consumed, including the pending partial line
        self._inode: int | None = None
        self._partial = b""

    def read(self, *, final: bool = False) -> list[Event]:
        try:
            with self.path.open("rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_ino != self._inode or st.st_size < self.offset:
                    self._inode, self.offset, self._partial = st.st_ino, 0, b""
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = b"" if final else lines.pop()
        return _parse_lines(lines)


def read_events(path: Path) -> list[Event]:
    """Every complete record of a log ([] when there is none yet); a torn last line (a crash mid-write) is skipped."""
    return EventTail(path).read(final=True)
