"""Paths in the channel directory and the two ownership locks.

Ownership uses open-file-description locks (``F_OFD_SETLK``) on two lock files: the kernel drops them when the
holder dies, and the *other* side can test them without taking them (``F_OFD_GETLK``), which is how each side
learns that its peer died, at once and across the containers' separate PID namespaces (pids are not comparable
there, and a heartbeat cannot tell a dead trainer from one inside a long step). Nobody ever waits on these locks.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import weakref
from pathlib import Path

from pipefill.channel.errors import ChannelBusyError, ChannelError
from pipefill.env import CHANNEL_DIR, DEFAULT_CHANNEL_DIR

__all__ = [
    "CHANNEL_FILE",
    "DEFAULT_CHANNEL_DIR",
    "FILL_LOCK",
    "HOLD_FILE",
    "TRAINER_LOCK",
    "OwnerLock",
    "hold_fill",
    "resolve_dir",
]

CHANNEL_FILE = "channel"
TRAINER_LOCK = "trainer.lock"
FILL_LOCK = "fill.lock"
HOLD_FILE = "fill.hold"
"""Present: the fill executor takes no bubble until it is gone (written by whoever pauses the fill; never the trainer)."""
FILE_MODE = 0o666  # the two containers may run as different users; the emptyDir is private to the pod

# struct flock on 64-bit Linux (x86-64 and arm64 share it): l_type, l_whence, l_start, l_len, l_pid, padding.
_FLOCK = struct.Struct("@hhqqi4x")
_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
_F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", None)


def resolve_dir(channel_dir: str | os.PathLike[str] | None) -> Path:
    """``channel_dir``, else ``$PIPEFILL_CHANNEL_DIR``, else ``/run/pipefill``."""
    if channel_dir is not None:
        return Path(channel_dir)
    return Path(os.environ.get(CHANNEL_DIR) or DEFAULT_CHANNEL_DIR)


def hold_fill(channel_dir: str | os.PathLike[str] | None, held: bool) -> None:
    """Tell the fill executor of ``channel_dir`` to idle (``held``) or to work again: creates or removes
    :data:`HOLD_FILE`. The trainer is not involved and goes on announcing; the fill executor looks before it waits
    for each bubble, and every 20 ms while held. Used by ``pipefill bench colocation`` to alternate training
    alone and with fill inside one run."""
    path = resolve_dir(channel_dir) / HOLD_FILE
    if held:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        os.close(fd)
    else:
        path.unlink(missing_ok=True)


def _require_ofd() -> tuple[int, int]:
    if _F_OFD_SETLK is None or _F_OFD_GETLK is None or struct.calcsize("@l") != 8:
        raise ChannelError("the bubble channel needs 64-bit Linux (open file description locks); this host has none")
    return _F_OFD_SETLK, _F_OFD_GETLK


_LOCKS: weakref.WeakSet[OwnerLock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker, say) shares the lock's open file description; if it kept its copy, the
    # lock would outlive a trainer killed before its children. The child drops its copy; the parent's lock stays.
    for lock in list(_LOCKS):
        lock.forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


class OwnerLock:
    """One lock file: its owner takes it; the peer only tests whether someone holds it."""

    def __init__(self, path: Path, *, create: bool) -> None:
        self.path = path
        self._setlk, self._getlk = _require_ofd()
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        self.fd = os.open(path, flags, FILE_MODE)
        if create:
            os.fchmod(self.fd, FILE_MODE)
        _LOCKS.add(self)

    def forget(self) -> None:
        """Close this process's descriptor (in a forked child)."""
        self.close()

    def acquire(self, *, who: str, holder: str) -> None:
        """Take the lock without waiting; ChannelBusyError naming ``holder`` when another process has it."""
        try:
            fcntl.fcntl(self.fd, self._setlk, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise ChannelBusyError(
                    f"{self.path} is held by a live {who} ({holder}): one {who} per channel directory; "
                    f"stop the other {who} or give this one its own PIPEFILL_CHANNEL_DIR"
                ) from None
            raise

    def held(self) -> bool:
        """Whether some open file description holds the lock (one fcntl; never waits)."""
        out = fcntl.fcntl(self.fd, self._getlk, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
        return bool(_FLOCK.unpack(out)[0] != fcntl.F_UNLCK)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
