"""A process started by ``pipefill local`` (or a benchmark built on it) ends with the process that started it.

On a cluster the kubelet stops a pod's containers; on one machine nothing would stop a trainer whose ``pipefill
local`` was killed (SIGKILL, a lost terminal): it would train on, alone, for as many steps as its spec says. The
runner sets ``PIPEFILL_PARENT_PID`` in its children's environment, and each child asks the kernel for SIGTERM when
its parent dies (``PR_SET_PDEATHSIG``), which it handles as it handles the kubelet's: commit or checkpoint, then exit.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
from collections.abc import Mapping

from pipefill import env

__all__ = ["signal_on_parent_death", "stop_with_parent"]

log = logging.getLogger("pipefill")

_PR_SET_PDEATHSIG = 1


def signal_on_parent_death(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (``PR_SET_PDEATHSIG``). Raises OSError
    where refused or not on Linux. Logs nothing, so a ``subprocess`` ``preexec_fn`` may call it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        failed = libc.prctl(_PR_SET_PDEATHSIG, sig) != 0
    except AttributeError as exc:  # no prctl: not Linux
        raise OSError(f"prctl(PR_SET_PDEATHSIG) is not available: {exc}") from exc
    if failed:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def stop_with_parent(environ: Mapping[str, str] | None = None) -> bool:
    """Where ``PIPEFILL_PARENT_PID`` names this process's parent: SIGTERM when it dies (at once when it has died
    already, before this call). Returns whether the request was made; elsewhere (a container) it does nothing."""
    raw = (os.environ if environ is None else environ).get(env.PARENT_PID, "")
    if not raw:
        return False
    try:
        parent = int(raw)
    except ValueError:
        log.warning("%s=%r is not a process id: not tied to a parent", env.PARENT_PID, raw)
        return False
    try:
        signal_on_parent_death()
    except OSError as exc:  # not Linux, or refused: the process only outlives its runner
        log.warning("cannot ask for SIGTERM when the parent dies: %s", exc)
        return False
    if os.getppid() != parent:  # it died between our start and the request: nothing will send the signal
        os.kill(os.getpid(), signal.SIGTERM)
    return True
