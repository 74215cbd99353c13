"""Fixtures for the bubble channel tests: a channel directory on tmpfs and real peer processes."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

PEER = Path(__file__).with_name("channel_peer.py")


class Peer:
    """A channel_peer.py process; its JSON events are read by a thread so tests can wait with a timeout."""

    def __init__(self, role: str, channel_dir: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER), role, str(channel_dir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.log: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def expect(
        self, event: str, timeout_s: float = 10.0, where: Callable[[dict[str, Any]], bool] | None = None
    ) -> dict[str, Any]:
        """The next event named ``event`` (and matching ``where``); fails the test after ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while True:
            left = end - time.monotonic()
            try:
                ev = self.events.get(timeout=max(left, 0.001))
            except queue.Empty:
                stderr = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
                raise AssertionError(
                    f"no {event!r} event within {timeout_s} s; seen {self.log[-5:]}; {stderr}"
                ) from None
            self.log.append(ev)
            if ev["event"] == event and (where is None or where(ev)):
                return ev

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """Send ``sig``; returns CLOCK_MONOTONIC ns just before it."""
        t = time.monotonic_ns()
        os.kill(self.proc.pid, sig)
        return t

    def finish(self, timeout_s: float = 30.0) -> int:
        rc = self.proc.wait(timeout=timeout_s)
        if rc != 0 and self.proc.stderr is not None:
            print(self.proc.stderr.read(), file=sys.stderr)
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def channel_dir() -> Iterator[Path]:
    """A fresh channel directory on tmpfs when there is one (what the emptyDir is), else under /tmp."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="pipefill-channel-test-", dir=base) as d:
        yield Path(d)


@pytest.fixture
def peers() -> Iterator[Callable[..., Peer]]:
    """Start peers with ``peers(role, dir, *args)``; all are killed at the end of the test."""
    started: list[Peer] = []

    def start(role: str, channel_dir: Path, *args: str) -> Peer:
        p = Peer(role, channel_dir, *args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
