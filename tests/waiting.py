"""The one way tests wait for something that happens elsewhere (a process, a file, the API server): ask again until the
answer is truthy, then return it; past the deadline fail, naming what was awaited. Never a bare sleep, never a loop
that quietly goes on when the deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], what: str, timeout_s: float = 30.0, interval_s: float = 0.05) -> T:
    """``check()``'s first truthy answer, asked every ``interval_s`` seconds for at most ``timeout_s``; an
    AssertionError naming ``what`` when none came."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
