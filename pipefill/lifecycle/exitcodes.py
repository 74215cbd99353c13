"""How a trainer's exit is classified, the same by ``pipefill local`` and by the operator.

A kubelet reports a container killed by signal N as exit code 128 + N (137 for SIGKILL, 143 for SIGTERM), while
Python's ``Popen.returncode`` says −N. :func:`exit_code` maps the local form onto the kubelet's, so one list,
``spec.runPolicy.restartOnExitCodes`` (default 75, 137, 143), decides on both runners whether the whole job restarts
from its checkpoints.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Iterable

__all__ = ["SIGNAL_BASE", "ExitClass", "classify", "exit_code", "exit_text"]

SIGNAL_BASE = 128  # the shell's and the kubelet's convention: killed by signal N -> 128 + N


class ExitClass(enum.StrEnum):
    SUCCEEDED = "Succeeded"  # 0
    RETRYABLE = "Retryable"  # in restartOnExitCodes: restart the gang from the last checkpoint
    PERMANENT = "Permanent"  # anything else: the job fails, whatever its peers exit with


def exit_code(returncode: int) -> int:
    """The kubelet's exit code for a local process' return code (−N → 128 + N)."""
    return SIGNAL_BASE - returncode if returncode < 0 else returncode


def classify(code: int, restart_on: Iterable[int]) -> ExitClass:
    """The class of a (kubelet-form) exit code under ``restart_on`` (``spec.runPolicy.restartOnExitCodes``)."""
    if code == 0:
        return ExitClass.SUCCEEDED
    return ExitClass.RETRYABLE if code in set(restart_on) else ExitClass.PERMANENT


def exit_text(code: int) -> str:
    """How a (kubelet-form) exit reads to a person: ``exited with code 137 (SIGKILL)``."""
    text = f"exited with code {code}"
    if code > SIGNAL_BASE:
        try:
            return f"{text} ({signal.Signals(code - SIGNAL_BASE).name})"
        except ValueError:
            return f"{text} (signal {code - SIGNAL_BASE})"
    return text
