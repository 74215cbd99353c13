"""Advisory file locks (``flock``) for ownership between fill executors that share a directory.

The kernel drops a process's locks when it dies, however it dies (SIGKILL included), so a lock is held exactly as long
as its owner lives: another executor, or the restarted one, takes over at once. The locks are per open file
description, so two holders in one process exclude each other as two processes do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["locked", "try_lock", "unlock"]


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
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the block, waiting for it (for short critical sections)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
