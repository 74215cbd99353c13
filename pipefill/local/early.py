"""``pipefill local``'s launcher, started before the command's own imports.

The launcher's preload (torch, torch._dynamo, our packages: launcher.py) is the longest part of a local run's start,
and ``pipefill local`` itself spends its first second importing the spec's models before the runner would start it.
:func:`start` starts it at once, from ``pipefill``'s entry point, so the two imports run side by side on two cores;
its output goes to a temporary file until the runner takes it (:func:`take`) and names the run's ``launcher.log``.
A command that ends before its run (``--help``, a refused manifest) kills it at exit, which costs nothing: it has
started no child. Imports only the standard library and launcher.py, which imports no more.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Mapping
from pathlib import Path

from pipefill import env
from pipefill.local.launcher import Launcher, child_environment

__all__ = ["start", "take"]

_started: Launcher | None = None


def start() -> None:
    """Start the launcher with this process's child environment (unless ``PIPEFILL_LOCAL_PRELOAD=0``, or started)."""
    global _started
    if _started is not None or os.environ.get(env.LOCAL_PRELOAD, "1") == "0":
        return
    _started = Launcher(child_environment(), None)
    atexit.register(_discard)


def take(environ: Mapping[str, str], log: Path) -> Launcher | None:
    """The launcher :func:`start` started, its output kept in ``log``; None when none was, or when it was started
    with another environment than ``environ`` (a child's start-up variables must be the launcher's: it is ended)."""
    global _started
    launcher, _started = _started, None
    if launcher is None:
        return None
    if launcher.environ != dict(environ):
        launcher.close(kill=True)
        return None
    launcher.keep_log(log)
    return launcher


def _discard() -> None:
    global _started
    launcher, _started = _started, None
    if launcher is not None:
        launcher.close(kill=True)
