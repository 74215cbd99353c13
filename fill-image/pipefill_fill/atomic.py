"""Atomic files: write to a temporary name in the same directory, fsync, rename over the target, fsync the directory.

A reader (or a restarted executor) sees either the old file or the complete new one, never a torn write, even after
SIGKILL or power loss. Temporary names start with ``.`` and end in ``.tmp`` so recovery can remove leftovers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["TMP_SUFFIX", "atomic_write", "atomic_write_bytes", "fsync_dir"]

TMP_SUFFIX = ".tmp"


def atomic_write(path: Path, write: Callable[[BinaryIO], object], *, durable: bool = True) -> None:
    """Create or replace ``path`` with what ``write(file)`` writes; ``durable``: fsync file and directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    atomic_write(path, lambda f: f.write(data), durable=durable)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
