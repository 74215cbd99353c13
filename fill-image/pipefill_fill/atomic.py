"""Atomic files: write to a temporary name in the same directory, fsync, rename over the target, fsync the directory.

A reader (or a restarted executor) sees either the old file or the complete new one, never a torn write, even after
SIGKILL or power loss. Temporary names start with ``.`` and end in ``.tmp`` so recovery can remove leftovers; they carry
the pid and a random token, because executors in different pods share an output volume and may have the same pid.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["TMP_SUFFIX", "atomic_create", "atomic_write", "atomic_write_bytes", "fsync_dir"]

TMP_SUFFIX = ".tmp"


def atomic_write(
    path: Path, write: Callable[[BinaryIO], object], *, durable: bool = True, pause: Callable[[], object] = bool
) -> None:
    """Create or replace ``path`` with what ``write(file)`` writes; ``durable``: fsync file and directory.

    ``pause()`` is called before the write and before each fsync: a caller that must not use the CPU at some times
    (the commit writer while a bubble is filled: :class:`pipefill_fill.commits.Quiet`) waits there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        pause()
        with open(tmp, "wb") as f:
            write(f)
            if durable:
                f.flush()
                pause()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        pause()
        fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True, pause: Callable[[], object] = bool) -> None:
    atomic_write(path, lambda f: f.write(data), durable=durable, pause=pause)


def atomic_create(path: Path, data: bytes) -> bool:
    """Create ``path`` with ``data`` unless it exists (then leave it); True when this call created it.

    The complete file appears at once or not at all (a hard link of a written temporary file), so concurrent creators
    agree on one winner and a reader never sees a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except FileNotFoundError:  # a recovery that removes leftovers took the temporary file: only after a winner
            if path.exists():
                return False
            raise
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
