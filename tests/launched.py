"""The tests' Python children, forked from a preloaded launcher as ``pipefill local`` forks its trainers and executors.

The tests start about a hundred ``python -m <module>`` children of their own (fill executors, trainer ranks, the
drivers and workers beside the tests), and each spent its first 2.3 CPU seconds importing torch: a tenth of the
suite's CPU time on CI's 2-core machine kind. ``popen`` takes ``subprocess.Popen``'s arguments and forks the child
from pipefill/local/launcher.py's launcher instead, one launcher per set of start-up variables in the session (torch
imported once each), the child's pipes passed to it; it returns the part of ``Popen`` the tests use. A child the
launcher cannot start (not ``python -m``, a launcher that is down) is started by ``Popen`` itself, as is every child
with ``PIPEFILL_TEST_PRELOAD=0``. Children differ from ``Popen``'s in one way the tests never see: each leads a
session of its own, and its parent is the launcher. One thread at a time may use it (pytest's).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from pipefill import env as env_names
from pipefill.local.launcher import PRELOAD, Forked, Launcher, startup_variables

__all__ = ["Launched", "Proc", "close_all", "popen", "run"]

_LAUNCHERS: dict[tuple[frozenset[tuple[str, str]], tuple[str, ...]], Launcher] = {}
_LOGS = Path(tempfile.mkdtemp(prefix="pipefill-test-launchers-"))


class Launched:
    """A child the launcher forked, behind ``Popen``'s names: pid, args, returncode, stdin/stdout/stderr, poll, wait,
    communicate, send_signal, terminate, kill."""

    def __init__(self, child: Forked, args: Sequence[str], streams: list[IO[Any] | None]) -> None:
        self._child, self.args, self.pid = child, list(args), child.pid
        self.stdin, self.stdout, self.stderr = streams
        self._readers: dict[str, tuple[threading.Thread, list[Any]]] = {}

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    def poll(self) -> int | None:
        return self._child.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._child.wait(timeout)

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> Launched:
        return self

    def __exit__(self, *exc: object) -> None:
        """As ``Popen``'s: its streams closed, its end awaited."""
        for stream in (self.stdout, self.stderr, self.stdin):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.wait()

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Popen's: ``input`` to stdin, which is closed; stdout and stderr read to their ends; the exit awaited.
        ``subprocess.TimeoutExpired`` after ``timeout`` s, and a later call goes on where this one stopped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None and not self.stdin.closed:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:
                pass
        for name in ("stdout", "stderr"):
            stream = getattr(self, name)
            if stream is not None and name not in self._readers:
                chunks: list[Any] = []
                reader = threading.Thread(target=lambda s=stream, c=chunks: c.append(s.read()), daemon=True)
                reader.start()
                self._readers[name] = (reader, chunks)
        for reader, _ in self._readers.values():
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        out = [self._output(name) for name in ("stdout", "stderr")]
        return out[0], out[1]

    def _output(self, name: str) -> Any:
        stream = getattr(self, name)
        if stream is None:
            return None
        stream.close()
        return self._readers[name][1][0]


Proc = subprocess.Popen[Any] | Launched  # what ``popen`` returns


def _launcher(environ: Mapping[str, str], preload: tuple[str, ...]) -> Launcher:
    key = (frozenset(startup_variables(environ).items()), preload)
    if key not in _LAUNCHERS:
        own = {**environ, env_names.PARENT_PID: str(os.getpid())}  # a killed test session ends it
        _LAUNCHERS[key] = Launcher(own, _LOGS / f"launcher-{len(_LAUNCHERS)}.log", preload=preload)
    return _LAUNCHERS[key]


def _ends(stream: int | IO[Any] | None, reading: bool, text: bool) -> tuple[int | None, IO[Any] | None, bool]:
    """For one of the child's streams: the descriptor it gets (None: the launcher's default), the file the caller
    keeps, and whether the descriptor is ours to close once it is passed."""
    if stream == subprocess.PIPE:
        r, w = os.pipe()
        theirs, ours = (w, r) if reading else (r, w)
        return theirs, open(ours, ("r" if reading else "w") + ("" if text else "b")), True
    if stream == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR), None, True
    if stream is None:
        return None, None, False
    return (stream if isinstance(stream, int) else stream.fileno()), None, False


def popen(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stdin: int | IO[Any] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    text: bool = False,
    preload: tuple[str, ...] = PRELOAD,
) -> Proc:
    """``subprocess.Popen(args, env=, cwd=, stdin=, stdout=, stderr=, text=)``, forked from a preloaded launcher
    where one can start it: one that imported ``preload`` (default: what trainers and fill executors import first;
    the operator's children take one with its own modules and no torch, whose pages would count in its memory)."""
    environ = dict(os.environ if env is None else env)
    argv = [str(a) for a in args]
    python_m = len(argv) > 2 and argv[0] == sys.executable and argv[1] == "-m"  # else no launcher is started for it
    launcher = _launcher(environ, preload) if python_m and os.environ.get("PIPEFILL_TEST_PRELOAD", "1") != "0" else None
    if launcher is not None and launcher.module_of(argv, environ) is not None:
        stdin_fd, stdin_file, close_in = _ends(stdin, False, text)
        out_fd, out_file, close_out = _ends(stdout, True, text)
        if stderr == subprocess.STDOUT:
            err_fd, err_file, close_err = (out_fd if out_fd is not None else 1), None, False
        else:
            err_fd, err_file, close_err = _ends(stderr, True, text)
        # a stream not given is inherited, as Popen's: this process's own 0, 1 or 2 (never the launcher's defaults)
        fds = (
            stdin_fd if stdin_fd is not None else 0,
            out_fd if out_fd is not None else 1,
            err_fd if err_fd is not None else 2,
        )
        try:
            child = launcher.launch(argv, environ, _LOGS / "unused.log", cwd=Path(cwd) if cwd else None, stdio=fds)
        finally:
            for fd, ours in ((stdin_fd, close_in), (out_fd, close_out), (err_fd, close_err)):
                if ours and fd is not None:
                    os.close(fd)
        if child is not None:
            return Launched(child, argv, [stdin_file, out_file, err_file])
        for file in (stdin_file, out_file, err_file):
            if file is not None:
                file.close()
    return subprocess.Popen(argv, env=environ, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, text=text)


def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    input: str | None = None,
    capture_output: bool = False,
    text: bool = False,
    timeout: float | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` of a child :func:`popen` starts (a ``pipefill local`` forked so also forks its own launcher
    rather than start one, pipefill/local/selffork.py): on ``timeout`` the child is killed and
    ``subprocess.TimeoutExpired`` raised; ``check``: ``subprocess.CalledProcessError`` for a non-zero exit."""
    pipe = subprocess.PIPE if capture_output else None
    stdin = subprocess.PIPE if input is not None else None
    proc = popen(args, env=env, cwd=cwd, stdin=stdin, stdout=pipe, stderr=pipe, text=text)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    done = subprocess.CompletedProcess(list(args), proc.wait(), out, err)
    if check:
        done.check_returncode()
    return done


@atexit.register
def close_all() -> None:
    """End every launcher (their children ended with the tests that started them)."""
    while _LAUNCHERS:
        _LAUNCHERS.popitem()[1].close()
    for log in sorted(_LOGS.glob("*.log")):
        if log.stat().st_size and "Traceback" in log.read_text(errors="replace"):
            print(f"{log}:\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
    for log in _LOGS.glob("*"):
        log.unlink()
    _LOGS.rmdir()
