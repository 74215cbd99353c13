"""Advisory file locks (``flock``) for ownership between fill executors that share a directory.

The kernel drops a process's locks when it dies, however it dies (SIGKILL included), so a lock is held exactly as long
as its owner lives: another executor, or the restarted one, takes over at once. The locks are per open file
description, so two holders in one process exclude each other as two processes do.

A holder that lives but hangs (stopped, or stuck on storage) keeps its lock: :func:`locked` with a ``timeout_s`` gives
up then (:class:`LockBusy`), so a caller with other work to do is not stopped with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LockBusy", "locked", "try_lock", "unlock"]

_POLL_S = (0.001, 0.05)
"""the first and the longest wait between tries of a lock with a time limit (flock has no timed wait)"""


class LockBusy(TimeoutError):
    """Another process held the lock for the whole time limit (it may hang, or its work on the storage may be slow)."""

    def __init__(self, path: Path, waited_s: float) -> None:
        self.path, self.waited_s = path, waited_s
        super().__init__(
            f"{path}: locked by another process for over {waited_s:.1f} s (a hung or stopped fill executor, or slow "
            f"storage); `fuser -v {path}` names the holder. Nothing was read or written; it is tried again later"
        )


def try_lock(path: Path, *, holder: str = "") -> int | None:
    """Take an exclusive lock on ``path`` (created if needed) without waiting; its descriptor, or None when another
    holds it. ``holder`` is written into the file for people (who holds it); it is not read by the protocol."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if holder:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder + "\n").encode(), 0)
    return fd


def unlock(fd: int) -> None:
    """Drop a lock taken by :func:`try_lock` (closing its descriptor drops the flock)."""
    os.close(fd)


@contextlib.contextmanager
def locked(path: Path, *, timeout_s: float | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the block (for short critical sections), waiting for it: for good, or
    at most ``timeout_s`` seconds, then :class:`LockBusy`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if timeout_s is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            _lock_within(fd, path, timeout_s)
        yield
    finally:
        os.close(fd)


def _lock_within(fd: int, path: Path, timeout_s: float) -> None:
    start = time.monotonic()
    pause = _POLL_S[0]
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            waited = time.monotonic() - start
            if waited >= timeout_s:
                raise LockBusy(path, waited) from None
            time.sleep(min(pause, timeout_s - waited))
            pause = min(pause * 2, _POLL_S[1])
