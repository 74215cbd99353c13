"""``pipefill local``'s launcher, started before the command's own imports.

The launcher's preload (torch, torch._dynamo, our packages: launcher.py) is the longest part of a local run's start,
and ``pipefill local`` itself spends its first second importing the spec's models before the runner would start it.
:func:`start` starts it at once, from ``pipefill``'s entry point, so the two imports run side by side on two cores;
its output goes to a temporary file until the runner takes it (:func:`take`) and names the run's ``launcher.log``.
A command that ends before its run (``--help``, a refused manifest) kills it at exit, which costs nothing: it has
started no child. Imports only the standard library and launcher.py, which imports no more. ``pipefill bench
colocation`` and ``bench fill`` start one too (their runs fork their processes from it). Where the program's entry
point runs in a process already preloaded (forked from a launcher itself), the launcher is forked from it (forker.py).
"""

from __future__ import annotations

import atexit
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pipefill.local.launcher import Launcher, child_environment, preload_wanted, startup_variables

__all__ = ["start", "take"]

_started: Launcher | None = None


def start(*, fork: bool = False) -> None:
    """Start the launcher with this process's child environment, its output in a temporary file (unless
    ``PIPEFILL_LOCAL_PRELOAD=0``, or started). ``fork``: from this process where it can (only where nothing above
    the call catches a child's exit: ``pipefill``'s entry point, forker.py)."""
    global _started
    if _started is not None or not preload_wanted():
        return
    fd, log = tempfile.mkstemp(prefix="pipefill-launcher-", suffix=".log")
    os.close(fd)
    _started = Launcher(child_environment(), Path(log), fork=fork)
    atexit.register(_discard)


def take(environ: Mapping[str, str], log: Path) -> Launcher | None:
    """The launcher :func:`start` started, its output moved to ``log``; None when none was, or when its start-up
    variables are not those of ``environ`` (it could fork none of these children faithfully: it is ended)."""
    global _started
    launcher, _started = _started, None
    if launcher is None:
        return None
    if startup_variables(launcher.environ) != startup_variables(environ):
        _end(launcher)
        return None
    launcher.move_log(log)
    return launcher


def _end(launcher: Launcher) -> None:
    """End a launcher that started no child, at once (it may be importing still), and remove its temporary log."""
    launcher.close(kill=True)
    launcher.log.unlink(missing_ok=True)


def _discard() -> None:
    global _started
    launcher, _started = _started, None
    if launcher is not None:
        _end(launcher)
