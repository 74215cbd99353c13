"""A preloaded interpreter that forks the local run's Python children: torch is imported once per run, not per process.

Every trainer and fill executor of ``pipefill local`` is ``python -m <module>``, and each spent its first 2.5-3.5 CPU
seconds importing torch (PyPI's CUDA build, measured in docs/benchmarks.md): four such imports start a 2-stage run,
and each gang restart or executor restart pays again. The runner starts this launcher once: it imports torch (and
numpy) and waits on a socket; each child is a ``fork()`` of it that becomes ``python -m <module>`` with the child's own
arguments, environment, working directory and log, in a process group of its own, as ``subprocess.Popen`` would
start it. Its pages of torch are shared with the launcher's until written.

What could differ from a fresh interpreter is what is read at interpreter or torch start-up; a child whose start-up
variables (``PYTHON*``, ``TORCH*``, ``OMP_*``, ``LD_*``, ``PIPEFILL_HOOK``, ... below) differ from the launcher's, or
that is not ``<this python> -m <module>``, is started by ``Popen`` instead, as is every child when the launcher is
down. The launcher starts no thread (``OMP_NUM_THREADS=1``), so ``fork()`` is safe, and it never touches a GPU: CUDA
initializes in the child. numpy's global generator is reseeded in each child, as a fresh process seeds it.

The launcher is the children's parent: it reaps them and reports each exit status (``Popen.returncode``'s form) to
the runner, which still signals their process groups itself. It ends with the runner (``PIPEFILL_PARENT_PID``), and
a child whose parent is the launcher is tied to the launcher, so a killed runner still stops every child. The
launcher's own side, and the launcher forked from a process that has imported its preload already, are forker.py.

Each child (and the launcher) leads a process group of its own, in the runner's session, not a session of its own:
Linux's autogroup (``kernel.sched_autogroup_enabled``, on by default in many distributions' kernels and on this
project's machines) gives each session its own scheduling group, and the kernel's idle policy ranks threads within
their group only. With a session each, a fill executor at ``SCHED_IDLE`` was its trainer's equal on their shared
core: half of it while both were runnable, and a trainer woken from a wait queued behind it. In one session they share
one group, where the idle policy means what fill.md says.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipefill import env
from pipefill.local.forker import ForkedLauncher, fork_launcher, forkable, main

__all__ = ["Forked", "Launcher", "child_environment", "preload_wanted", "signal_group", "startup_variables"]

_logger = logging.getLogger("pipefill")

# What every trainer and fill executor imports first: torch; torch._dynamo, which a process's first optimizer imports
# (1.9 s of each trainer's start, and again at each restart); our own packages (the spec's models, 0.4 s). None of
# them starts a thread or reads the environment at import (what a child's differs in, it reads when it runs).
PRELOAD = (
    "torch", "torch.distributed", "torch._dynamo", "numpy", "pipefill.spec", "pipefill_trainer.runtime",
    "pipefill_fill.runner",
)  # fmt: skip
# Read when the interpreter, libc, OpenMP/BLAS or torch start: a child must see what the launcher saw. PIPEFILL_HOOK
# too: the bubble hook's sitecustomize reads it at interpreter start (trainer-image/pipefill_hook/boot).
_STARTUP_PREFIXES = (
    "PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "OPENBLAS", "GOMP", "LD_", "MALLOC", "GLIBC", "PIPEFILL_HOOK",
)  # fmt: skip
_READY_TIMEOUT_S = 60.0  # torch's import: 3 s on an idle 2-core machine, far longer under load
_REPLY_TIMEOUT_S = 10.0


def preload_wanted() -> bool:
    """Whether children are forked from a launcher (``PIPEFILL_LOCAL_PRELOAD=0``: each imports torch itself)."""
    return os.environ.get(env.LOCAL_PRELOAD, "1") != "0"


def child_environment(container: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child's environment: this process's, its container's, then unbuffered output, one OpenMP thread and tied to
    this process (pipefill.parent). A launcher started with ``child_environment()`` can fork every child whose
    container adds no start-up variable."""
    child = dict(os.environ)
    child.update(container or {})
    child.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", env.PARENT_PID: str(os.getpid())})
    return child


def signal_group(pid: int, signum: int) -> bool:
    """Send ``signum`` to the process group of child ``pid`` (its own), or to ``pid`` alone while it does not lead one
    yet: a forked child's pid reaches the runner as soon as the launcher has forked it, before the child calls
    ``setpgid()``, and a group signal sent in between found no group and was lost. False where it is gone (0:
    whether it is there)."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return False
    return True


def startup_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment variables read at interpreter or torch start-up: equal for a launcher and its children."""
    return {k: v for k, v in environ.items() if k.startswith(_STARTUP_PREFIXES)}


class Forked:
    """A child forked by the launcher: the part of ``subprocess.Popen`` the runner uses (pid, poll, wait)."""

    def __init__(self, launcher: Launcher, pid: int) -> None:
        self.launcher, self.pid = launcher, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.launcher.exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            self.launcher.read(min(left, 0.5) if left is not None else 0.5)
        assert self.returncode is not None
        return self.returncode


class Launcher:
    """The runner's side: starts the launcher process and asks it for children. Not thread-safe (the runner's loop
    alone uses it). ``log`` receives the launcher's own output (its preload's warnings, a crash); :meth:`move_log`
    moves it."""

    def __init__(
        self, environ: Mapping[str, str], log: Path, *, preload: tuple[str, ...] = PRELOAD, fork: bool = False
    ) -> None:
        """``fork``: fork it from this process where it can (forker.py: only where no caller above would catch the
        exit of the children, which leave through the caller's frames)."""
        self.environ = dict(environ)
        ours, theirs = socket.socketpair()
        self._sock = ours
        self._buf = b""
        self._exits: dict[int, int] = {}
        self._ready: bool | None = None  # None: not heard from yet
        self._waiting = False  # launch() waits for the reply to a start
        self._reply: dict[str, Any] | None = None
        self._closed = False  # its socket reached EOF: it exited, and no exit is reported any more
        self.down = ""  # why it starts no more children, once it does not
        self._warned, self.log = False, log
        self._copy_to: Path | None = None  # where the log goes at close, when it could not be moved there
        log.parent.mkdir(parents=True, exist_ok=True)
        same = startup_variables(os.environ) == startup_variables(self.environ)
        self.forked = fork and same and forkable(preload, (ours, theirs))  # it imported it all already
        self._proc: subprocess.Popen[bytes] | ForkedLauncher
        self._proc = (
            fork_launcher(self.environ, log, ours, theirs, preload)
            if self.forked
            else self._start(log, theirs, preload)
        )
        theirs.close()

    def _start(self, log: Path, theirs: socket.socket, preload: tuple[str, ...]) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), *preload],
                env=self.environ,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
                process_group=0,
            )

    def _messages(self, timeout: float) -> list[dict[str, Any]]:
        """What arrived within ``timeout`` seconds (0: what is there now); at EOF the launcher is down for good."""
        if self._closed:
            return []
        readable, _, _ = select.select([self._sock], [], [], max(timeout, 0.0))
        if readable:
            try:
                data = self._sock.recv(1 << 16)
            except OSError as exc:
                data, self.down = b"", f"its socket failed: {exc}"
            if not data:
                self._closed = True
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=5)
                self.down = self.down or f"it exited ({self._proc.returncode})"
            self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        return [json.loads(line) for line in lines if line]

    def read(self, timeout: float = 0.0) -> None:
        """Take in what the launcher said within ``timeout`` seconds: exits are kept for :meth:`exit_status`, the
        reply to a start for :meth:`launch`. A child started after its start was given up on is killed."""
        for message in self._messages(timeout):
            if "exit" in message:
                self._exits[int(message["exit"])] = int(message["code"])
            elif "ready" in message:
                self._ready = bool(message["ready"])
                if not self._ready:
                    self.down = str(message.get("error", "its preload failed"))
            elif self._waiting:
                self._reply = message
            elif "pid" in message:  # too late: the runner started it with Popen meanwhile
                with contextlib.suppress(PermissionError):
                    signal_group(int(message["pid"]), signal.SIGKILL)

    def ready(self, timeout: float = _READY_TIMEOUT_S) -> bool:
        """Whether the launcher has preloaded and takes requests (waits up to ``timeout`` seconds for it)."""
        deadline = time.monotonic() + timeout
        while self._ready is None and not self.down and time.monotonic() < deadline:
            self.read(deadline - time.monotonic())
        if self._ready is None and not self.down:
            self.down = f"not ready after {timeout:.0f} s"
        return bool(self._ready) and not self.down

    def module_of(self, argv: list[str], environ: Mapping[str, str]) -> str | None:
        """The module a child would run, where the launcher can start it: ``<this python> -m <module> ...`` with the
        launcher's start-up variables; None: start it with ``Popen``."""
        if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m" or argv[2].startswith("-"):
            return None
        return argv[2] if startup_variables(environ) == startup_variables(self.environ) else None

    def launch(
        self,
        argv: list[str],
        environ: Mapping[str, str],
        log: Path,
        *,
        cwd: Path | None = None,
        stdio: tuple[int | None, int | None, int | None] = (None, None, None),
    ) -> Forked | None:
        """Fork ``argv`` with ``environ`` in ``cwd`` (default: ours), its output appended to ``log``; None where the
        launcher cannot start it (the caller starts it with ``Popen``). ``stdio``: descriptors the child takes as its
        stdin, stdout and stderr instead (a pipe's end, say: passed over the socket, the caller still closes its own
        copy); a None stream is stdin from /dev/null, output to ``log``."""
        module = self.module_of(argv, environ)
        if module is None:
            return None
        if not self.ready():
            if not self._warned:
                self._warned = True
                _logger.warning("the preloaded launcher is down (%s): each process imports torch itself", self.down)
            return None
        fds = [fd for fd in stdio if fd is not None]
        request: dict[str, Any] = {"module": module, "argv": argv, "env": dict(environ), "log": str(log)}
        request.update(cwd=os.fspath(cwd or os.getcwd()), stdio=[fd is not None for fd in stdio])
        try:
            data = json.dumps(request).encode() + b"\n"
            sent = socket.send_fds(self._sock, [data], fds) if fds else 0
            self._sock.sendall(data[sent:])
        except OSError as exc:
            self.down = f"its socket failed: {exc}"
            return None
        deadline = time.monotonic() + _REPLY_TIMEOUT_S
        self._waiting, self._reply = True, None
        try:
            while self._reply is None and not self._closed and time.monotonic() < deadline:
                self.read(deadline - time.monotonic())
        finally:
            self._waiting = False
        reply, self._reply = self._reply, None
        if reply is not None and "pid" in reply:
            return Forked(self, int(reply["pid"]))
        self.down = str(reply.get("error", reply)) if reply is not None else self.down or "no reply to a start"
        return None

    def exit_status(self, pid: int) -> int | None:
        """How child ``pid`` ended (``Popen.returncode``'s form), None while it runs. Where the launcher is gone, so is
        the report: its children, tied to it, got SIGTERM; one that has ended is reported as ended by SIGTERM."""
        self.read()
        if pid in self._exits:
            return self._exits[pid]
        if self._closed:
            with contextlib.suppress(PermissionError):
                if not signal_group(pid, 0):
                    self._exits[pid] = -signal.SIGTERM
                    return self._exits[pid]
        return None

    def move_log(self, to: Path) -> None:
        """Move the launcher's log to ``to``: now where both are on one file system (the launcher writes on into the
        same file), else at :meth:`close`, by a copy."""
        to.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(self.log, to)
        except OSError:
            self._copy_to = to
        else:
            self.log = to

    def close(self, *, kill: bool = False) -> None:
        """End the launcher (call once its children ended: it stops taking requests and exits); ``kill``: at once,
        for a launcher that started no child (it may be importing still)."""
        with contextlib.suppress(OSError):
            self._sock.close()
        if kill:
            self._proc.kill()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._copy_to is not None:
            with open(self._copy_to, "ab") as kept:
                kept.write(self.log.read_bytes())
            self.log.unlink(missing_ok=True)
            self.log, self._copy_to = self._copy_to, None


if __name__ == "__main__":
    main(sys.argv[1:])
