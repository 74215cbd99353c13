"""The executor's event log: one JSON object per line in ``$PIPEFILL_OUT_DIR/fill-events.jsonl`` (docs/fill.md).

Times named ``*_ns`` are CLOCK_MONOTONIC nanoseconds (the clock the channel uses, comparable with the trainer's log
on the same machine); ``t_unix_s`` is wall-clock time. Lines are flushed as written, so a crash loses at most the line
being written; readers skip a torn last line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["EVENTS_FILE", "EventLog", "read_events"]

EVENTS_FILE = "fill-events.jsonl"


class EventLog:
    """Appends events to ``<out_dir>/fill-events.jsonl``; without ``out_dir`` it records nothing."""

    def __init__(self, out_dir: Path | None) -> None:
        self.path = out_dir / EVENTS_FILE if out_dir is not None else None
        self._file: IO[str] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed in close())

    def write(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        record = {"event": event, "t_unix_s": round(time.time(), 6), "pid": os.getpid(), **fields}
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete event of a log (a torn last line, from a crash, is skipped)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
