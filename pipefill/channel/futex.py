"""Shared (non-private) futex wait and wake on a 32-bit word inside a file mapping, through ``syscall(2)``.

Two processes map the same file, so the futex is keyed by the page, not by the address space: the ops must not
carry ``FUTEX_PRIVATE_FLAG``. ctypes releases the GIL for the call. Where the syscall number is unknown or the
kernel refuses the call (seccomp), waiting degrades to sleeping ``POLL_S`` and waking to nothing: correct, but the
fill then sees a bubble up to ``POLL_S`` late (the channel logs this once).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import platform
from collections.abc import Callable

__all__ = ["POLL_S", "Futex", "futex_supported"]

POLL_S = 0.0005
"""Sleep between polls when futexes are unavailable: 0.5 ms, a tenth of a short bubble."""

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_BENIGN = {errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR}
_log = logging.getLogger(__name__)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load() -> tuple[int, Callable[..., int]] | None:
    number = _SYS_FUTEX.get(platform.machine().lower())
    if number is None:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    call: Callable[..., int] = fn
    return number, call


_SYSCALL = _load()


def futex_supported() -> bool:
    """True when futex wait/wake is available on this machine (else the channel sleep-polls)."""
    return _SYSCALL is not None


class Futex:
    """Wait on / wake the 32-bit word at ``address`` (inside a shared file mapping the caller keeps alive)."""

    def __init__(self, address: int) -> None:
        self.address = address
        self._ts = _Timespec(0, 0)
        self._ts_addr = ctypes.addressof(self._ts)
        self._call = _SYSCALL

    def wait(self, expected: int, timeout_s: float) -> None:
        """Sleep while the word equals ``expected``, at most ``timeout_s``; returns early on a wake or a change."""
        if timeout_s <= 0:
            return
        if self._call is None:
            import time

            time.sleep(min(timeout_s, POLL_S))
            return
        ns = int(timeout_s * 1e9)
        self._ts.tv_sec, self._ts.tv_nsec = divmod(ns, 1_000_000_000)
        number, fn = self._call
        if fn(number, self.address, _FUTEX_WAIT, expected & 0xFFFFFFFF, self._ts_addr) == -1:
            self._check(ctypes.get_errno())

    def wake(self) -> None:
        """Wake every waiter on the word; never blocks (a wake with no waiter is a short syscall)."""
        if self._call is not None:
            number, fn = self._call
            if fn(number, self.address, _FUTEX_WAKE, 0x7FFFFFFF, None) == -1:
                self._check(ctypes.get_errno())

    def _check(self, err: int) -> None:
        if err not in _BENIGN:
            _log.warning(
                "futex syscall failed (%s); the channel falls back to polling every %.1f ms",
                errno.errorcode.get(err, err),
                POLL_S * 1e3,
            )
            self._call = None
