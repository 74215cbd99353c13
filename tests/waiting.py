"""The one way tests wait for something that happens elsewhere (a process, a file, the API server): ask again until the
answer is truthy, then return it; past the deadline fail, naming what was awaited and the last answer seen. Never a
bare sleep, never a loop that quietly goes on when the deadline passes. Where something signals a change (a watch, a
cache's change event), pass it as ``pause`` and the wait wakes on that signal instead of on a timer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    what: str,
    timeout_s: float = 30.0,
    interval_s: float = 0.05,
    *,
    until: Callable[[Any], bool] | None = None,
    pause: Callable[[float], object] | None = None,
) -> T:
    """``check()``'s first answer that holds — truthy, or ``until(answer)`` where ``until`` is given — asked at least
    once and then again for at most ``timeout_s`` seconds. Between two asks it sleeps ``interval_s``, or, given
    ``pause``, calls ``pause(seconds left)``, which returns when the awaited thing may have changed (or the time is
    up). An AssertionError naming ``what`` and the last answer seen when none held."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if until(got) if until is not None else got:
            return got  # type: ignore[return-value]  # truthy, or what ``until`` accepted
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last seen: {got!r}")
        if pause is not None:
            pause(left_s)
        else:
            time.sleep(min(interval_s, left_s))
