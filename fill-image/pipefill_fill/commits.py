"""The file part of commits, off the filling thread: one writer thread per executor writes what bubbles staged.

A commit's device part (:meth:`pipefill_fill.store.ProgressStore.stage`: the state to the host, outputs and state to
bytes) is planned into a bubble like a step, with its measured cost. Its file part — write, fsync, rename, the
pointer, under the slice's commit lock — takes as long as the storage does (milliseconds on a local disk, much more
on a network volume or a disk that is busy), so it runs here, never inside a bubble and never holding the next one
up. The writer thread spends its time in system calls, which release the GIL, so the filling thread's steps go on
while a commit is written.

But not at full speed where they share a core. Each fsync makes the kernel work on the writer's core (the journal
commit, the block layer, the completion interrupt), and a commit is six of them (the state file, the chunk, the
pointer; each file and its directory). In ``pipefill bench fill --workload encoder-inference --life`` at 10 ms
bubbles on the development VM, 26 of the 28 bubbles that overran the guard had a commit being written meanwhile: the
filling thread's late step ran at a third of its core, preempted 10–25 times. So the writer is :class:`Quiet` while a
bubble is filled: before its write and each fsync it waits until the filling thread has left the bubble (at most
:data:`QUIET_WAIT_S`, so a commit is written even when the bubbles leave no time between them). One file operation
begun just before a bubble opened may still overlap it.

Exactly once as before: the pointer moves only when the file part is complete, and a task has at most one commit in
flight (its next one is due only once this one is written), so commits of a store are written in the order they were
staged. A crash between the parts loses the staged bytes only; recovery resumes from the pointer and the work after
it is redone (:mod:`pipefill_fill.store`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pipefill_fill.store import ProgressStore, Staged

__all__ = ["QUIET_WAIT_S", "CommitWriter", "Pending", "Quiet"]

log = logging.getLogger("pipefill_fill")

WriteFn = Callable[[ProgressStore, Staged], int]


QUIET_WAIT_S = 1.0
"""The longest the writer waits for the filling thread to leave a bubble before each file operation."""


class Quiet:
    """Whether the filling thread is in a bubble: the commit writer's file operations wait until it is not."""

    def __init__(self, *, wait_s: float = QUIET_WAIT_S) -> None:
        self.wait_s = wait_s
        self._outside = threading.Event()
        self._outside.set()

    def enter(self) -> None:
        """The filling thread works in a bubble from now on."""
        self._outside.clear()

    def leave(self) -> None:
        """The filling thread left the bubble."""
        self._outside.set()

    def wait(self) -> bool:
        """Until no bubble is being filled (at most ``wait_s``); False when it gave up waiting."""
        return self._outside.wait(self.wait_s)


@dataclass
class Pending:
    """A staged commit on its way to the storage; ``done`` is set when it is written (or failed with ``error``)."""

    store: ProgressStore
    staged: Staged
    stage_s: float
    """what its device part took"""
    between: bool = False
    """its device part was made between bubbles (it fit none: :func:`pipefill_fill.inbubble.commit_between`)"""
    done: threading.Event = field(default_factory=threading.Event)
    written: int = 0
    write_s: float = 0.0
    error: BaseException | None = None

    def wait(self, timeout_s: float | None = None) -> bool:
        return self.done.wait(timeout_s)


class CommitWriter:
    """One thread that writes staged commits in the order they were submitted (started on the first).

    ``write``: the file part (default: the store's, each file operation once ``quiet`` lets it; tests pass a slow
    one). A failure is kept on its :class:`Pending` (``error``) for the filling thread to handle:
    :class:`pipefill_fill.store.Superseded` stops the slice, anything else fails the job."""

    def __init__(
        self, *, write: WriteFn | None = None, quiet: Quiet | None = None, clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self.quiet = quiet or Quiet()
        self._write = write or (lambda store, staged: store.write(staged, pause=self.quiet.wait))
        self._clock = clock
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, store: ProgressStore, staged: Staged, *, stage_s: float) -> Pending:
        pending = Pending(store, staged, stage_s)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="pipefill-commit-writer", daemon=True)
                self._thread.start()
        self._queue.put(pending)
        return pending

    def close(self, timeout_s: float | None = None) -> bool:
        """Write what was submitted, then stop the thread; False when it did not finish within ``timeout_s``."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return True
        self._queue.put(None)
        thread.join(timeout_s)
        return not thread.is_alive()

    def _run(self) -> None:
        while (pending := self._queue.get()) is not None:
            t0 = self._clock()
            try:
                pending.written = self._write(pending.store, pending.staged)
            except BaseException as exc:  # handed to the filling thread, which owns the job's fate
                pending.error = exc
            pending.write_s = (self._clock() - t0) / 1e9
            pending.done.set()
