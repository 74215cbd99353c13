"""The launcher process (launcher.py's other side): it forks each child it is asked for and reports its exit; and
the launcher forked from the process that needs one, where that process already is what a launcher starts as.

A launcher (launcher.py) is a fresh ``python -m pipefill.local.launcher`` that imports its preload (torch, numpy,
our packages: 6 CPU seconds on CI's 2-core machine kind) before it forks a child. A ``pipefill local`` that was
itself forked from a launcher (the tests start theirs so, tests/launched.py) has all of that imported already, with
the children's start-up variables: starting a second interpreter to import it again would waste those seconds on
every run. Such a process forks the launcher from itself instead (``Launcher(fork=True)``, which ``pipefill``'s entry
point passes, pipefill/local/early.py).

A fork is the launcher ``Popen`` would start only while this process still is as a launcher starts: the preload
imported, one thread (no lock held by a thread the fork leaves behind), the children's start-up variables (the
caller compares them: read at interpreter and torch start), and no open descriptor but its standard streams and the
launcher's socket pair (a pipe's end held on would keep a reader from its EOF). :func:`forkable` checks the rest, and
``Launcher`` starts an interpreter where one fails. The fork does what ``Popen`` would: a process group of its own
in the runner's session (launcher.py says why), stdin from /dev/null, output to the log, the children's environment,
the launcher's command line in ps; then it runs :func:`main`. A child forked from it leaves by ``SystemExit`` or an
exception through the frames of the process the launcher was forked from: only a caller with no handler and no cleanup
above it may fork (``pipefill``'s entry point starts its launcher before any), so that the child exits as
``python -m`` would.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipefill import env

__all__ = ["ForkedLauncher", "fork_launcher", "forkable", "main"]


_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no /proc: count none, so nothing forks
        return 0


def _open_descriptors(keep: set[int]) -> set[int]:
    """This process's open descriptors beyond ``keep`` (the one that listed them is closed again by then)."""
    listed = {int(name) for name in os.listdir("/proc/self/fd")} - keep
    still = set()
    for fd in listed:
        with contextlib.suppress(OSError):
            os.fstat(fd)
            still.add(fd)
    return still


def forkable(preload: tuple[str, ...], sockets: tuple[socket.socket, ...]) -> bool:
    """Whether a fork of this process is the launcher ``Popen`` would start with ``preload`` (the caller compares
    the start-up variables), ``sockets`` its socket pair."""
    if not preload or not all(name in sys.modules for name in preload) or _threads() != 1:
        return False
    try:
        return not _open_descriptors({0, 1, 2, *(s.fileno() for s in sockets)})
    except OSError:
        return False


class ForkedLauncher:
    """The launcher forked from this process: the part of ``subprocess.Popen`` that ``Launcher`` uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:  # as Popen.wait(timeout) does: poll, with a short pause
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def fork_launcher(
    environ: Mapping[str, str], log: Path, ours: socket.socket, theirs: socket.socket, preload: tuple[str, ...]
) -> ForkedLauncher:
    """Fork the launcher (call where :func:`forkable`); in the fork, this call never returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedLauncher(pid)
    try:
        os.setpgid(0, 0)
        os.close(ours.detach())  # the runner's end; detached, so that nothing closes the number again
        fd = theirs.detach()  # owned by the launcher's socket from here
        for target, out in ((0, os.open(os.devnull, os.O_RDONLY)), (1, os.open(log, _APPEND, 0o644))):
            os.dup2(out, target)
            os.close(out)
        os.dup2(1, 2)
        os.environ.clear()
        os.environ.update(environ)
        sys.argv = [str(Path(__file__).with_name("launcher.py")), str(fd), *preload]  # as ``python -m`` sets it
        with contextlib.suppress(ImportError):  # ps and top show the launcher's command
            from setproctitle import setproctitle

            setproctitle(shlex.join([sys.executable, "-m", "pipefill.local.launcher", *sys.argv[1:]]))
    except BaseException:  # never back into the frames of the process it was forked from
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    main(sys.argv[1:])  # in the launcher: serves until EOF, then os._exit; in a child: runs its module
    raise SystemExit(0)  # the child's module returned: the interpreter's exit, as ``python -m``'s


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the runner is gone: the loop sees EOF next
        sock.sendall(json.dumps(message).encode() + b"\n")


def _become(request: dict[str, Any], fds: list[int], launcher_pid: int) -> None:
    """In a fresh fork: the child ``Popen`` would have started (its own process group, its streams: the descriptors
    passed for them, else stdin from /dev/null and output to its log; its working directory and environment)."""
    os.setpgid(0, 0)
    given = iter(fds)
    wanted = [next(given) if passed else None for passed in request.get("stdio", [False] * 3)]
    stdin = os.open(os.devnull, os.O_RDONLY) if wanted[0] is None else wanted[0]
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if None in wanted[1:] else -1
    streams = [stdin, *(log if fd is None else fd for fd in wanted[1:])]
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
    for fd in set(streams) - {0, 1, 2}:
        os.close(fd)
    with contextlib.suppress(ImportError):  # ps, top and pgrep -f show the child's own command line (not in images)
        from setproctitle import setproctitle

        setproctitle(shlex.join(request["argv"]))  # before the environment changes: it needs the original one
    os.chdir(request["cwd"])
    environ = dict(request["env"])
    if environ.get(env.PARENT_PID):  # tied to its parent, this launcher, which is tied to the runner
        environ[env.PARENT_PID] = str(launcher_pid)
    os.environ.clear()
    os.environ.update(environ)
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS
        sys.modules["numpy"].random.seed()
    sys.argv = [sys.argv[0], *request["argv"][3:]]


def _serve(sock: socket.socket) -> dict[str, Any] | None:
    """Fork a child per request, report each exit; returns a request in the child, None in the launcher at EOF. A
    request's stream descriptors arrive with its first bytes; the launcher closes its copies once it forked."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    buf = b""
    passed: list[int] = []  # descriptors received, in order, for the requests not yet served
    me = os.getpid()
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if sock.fileno() not in readable:
            continue
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        if not data:
            return None
        buf += data
        passed += fds
        *lines, buf = buf.split(b"\n")
        for line in filter(None, lines):
            request = json.loads(line)
            count = sum(request.get("stdio", []))
            mine, passed = passed[:count], passed[count:]
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as exc:
                _send(sock, {"error": f"fork failed: {exc}"})
                pid = -1
            if pid != 0:
                for fd in mine:  # the child's now (or nobody's): a pipe must see EOF when the child's ends close
                    os.close(fd)
                if pid > 0:
                    _send(sock, {"pid": pid})
                continue
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (wake_r, wake_w, *passed):  # passed: another request's (none while they come one at a time)
                os.close(fd)
            sock.close()
            _become(request, mine, me)
            return dict(request)


def main(argv: list[str]) -> None:
    from pipefill.parent import stop_with_parent

    sock = socket.socket(fileno=int(argv[0]))
    stop_with_parent()  # a killed runner ends the launcher, and with it (their parent) every child
    try:
        for name in argv[1:]:
            with contextlib.suppress(ImportError):  # not installed here (numpy, say): nothing to share of it
                importlib.import_module(name)
    except Exception as exc:  # any failure of an import: the runner starts its children itself
        _send(sock, {"ready": False, "error": f"preloading failed: {type(exc).__name__}: {exc}"})
        return
    # every child shares the preload's objects: out of the cycle collector, a child's full collections skip them and
    # leave their pages shared (Python's gc docs: freeze before fork); the fill executor's first start-up walked
    # them twice (pipefill_fill.collect), 0.28 s each, in its trainer's bubbles on a CPU
    gc.freeze()
    _send(sock, {"ready": True})
    request = _serve(sock)
    if request is None:  # the runner closed the socket, its children ended: nothing of this process is left to
        sys.stdout.flush()  # finalize, and tearing torch down took 0.6 s of every run's end (docs/benchmarks.md)
        sys.stderr.flush()
        os._exit(0)
    # a child: run its module as ``python -m`` would, then exit as it does
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
