"""The control plane's processes: start with logs in files, wait for health, stop cleanly, find them again.

A cluster started by ``make cluster`` outlives the command that started it, so every process is recorded in
``state.json`` with its start time from ``/proc`` (a recycled PID is never mistaken for ours). A cluster started by a
test session dies with it: its processes get ``PR_SET_PDEATHSIG`` so a killed pytest leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipefill.parent import signal_on_parent_death
from pipefill.ports import free_port

__all__ = ["Proc", "StartFailed", "alive", "free_port", "wait_http", "wait_until"]


class StartFailed(RuntimeError):
    """A component did not become healthy; the message names it and quotes the end of its log."""


def _start_time(pid: int) -> str | None:
    """The start time of a live ``pid`` (field 22 of /proc/PID/stat); None when gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        return None
    return fields[19]


def _die_with_parent() -> None:
    with contextlib.suppress(OSError):  # refused: the component only outlives a killed test session
        signal_on_parent_death(signal.SIGTERM)


@dataclass
class Proc:
    """One component: its name, PID, and the start time that identifies that PID."""

    name: str
    pid: int
    started: str | None
    log: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)  # when we started it

    @classmethod
    def spawn(cls, name: str, argv: list[str], log: Path, *, detach: bool, env: dict[str, str] | None = None) -> Proc:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=None if detach else _die_with_parent,
            )
        return cls(name, popen.pid, _start_time(popen.pid), log, popen)

    def running(self) -> bool:
        if self.popen is not None:  # our child: only Popen may reap it, or it warns that it is "still running"
            return self.popen.poll() is None
        return self.started is not None and _start_time(self.pid) == self.started

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns once the process is gone."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self.running():
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            deadline = time.monotonic() + timeout_s
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.05)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "started": self.started, "log": str(self.log)}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Proc:
        started = data["started"]
        return cls(
            str(data["name"]), int(str(data["pid"])), None if started is None else str(started), Path(str(data["log"]))
        )


def alive(state: Path) -> list[Proc]:
    """The processes recorded in ``state`` that still run."""
    try:
        procs = [Proc.from_json(p) for p in json.loads(state.read_text())["processes"]]
    except (OSError, ValueError, KeyError):
        return []
    return [p for p in procs if p.running()]


def wait_until(what: str, check: Callable[[], bool], *, timeout_s: float, proc: Proc | None = None) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` (and quoting ``proc``'s log) when it does not in time or
    ``proc`` exited."""
    deadline = time.monotonic() + timeout_s
    delay_s = 0.05
    while True:
        if check():
            return
        if proc is not None and not proc.running():
            raise StartFailed(f"{proc.name} exited while waiting for {what}; the end of {proc.log}:\n{proc.tail()}")
        if time.monotonic() > deadline:
            tail = f"; the end of {proc.log}:\n{proc.tail()}" if proc else ""
            raise StartFailed(f"timed out after {timeout_s:.0f} s waiting for {what}{tail}")
        time.sleep(delay_s)
        delay_s = min(delay_s * 1.5, 0.5)


def wait_http(url: str, *, context: ssl.SSLContext | None, proc: Proc, timeout_s: float) -> None:
    """Wait until ``url`` answers 200 (a component's /healthz, /readyz or /health)."""

    def ok() -> bool:
        try:
            with urllib.request.urlopen(url, context=context, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    wait_until(url, ok, timeout_s=timeout_s, proc=proc)
