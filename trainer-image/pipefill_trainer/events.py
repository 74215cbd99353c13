"""The trainer's event log: JSON lines in ``$PIPEFILL_OUT_DIR/events.jsonl`` (format in ``docs/trainer.md``).

Times are ``time.monotonic_ns()`` of the writing process (one clock per machine, so ranks on one host line up).
Lines are buffered and flushed once per step, off the critical path of the step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

__all__ = ["EventLog"]


class EventLog:
    def __init__(self, path: Path | None) -> None:
        self._fh: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115 - closed in close()

    @property
    def enabled(self) -> bool:
        return self._fh is not None

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
