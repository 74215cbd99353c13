"""The file part of commits, off the filling thread: one writer thread per executor writes what bubbles staged.

A commit's device part (:meth:`pipefill_fill.store.ProgressStore.stage`: the state to the host, outputs and state to
bytes) is planned into a bubble like a step, with its measured cost. Its file part — write, fsync, rename, the
pointer, under the slice's commit lock — takes as long as the storage does (milliseconds on a local disk, much more
on a network volume or a disk that is busy), so it runs here, never inside a bubble and never holding the next one
up. The writer thread spends its time in system calls, which release the GIL, so the filling thread's steps go on
while a commit is written.

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

__all__ = ["CommitWriter", "Pending", "write_now"]

log = logging.getLogger("pipefill_fill")

WriteFn = Callable[[ProgressStore, Staged], int]


def write_now(store: ProgressStore, staged: Staged) -> int:
    """The file part as the store does it (the writer's default)."""
    return store.write(staged)


@dataclass
class Pending:
    """A staged commit on its way to the storage; ``done`` is set when it is written (or failed with ``error``)."""

    store: ProgressStore
    staged: Staged
    stage_s: float
    """what its device part took"""
    done: threading.Event = field(default_factory=threading.Event)
    written: int = 0
    write_s: float = 0.0
    error: BaseException | None = None

    def wait(self, timeout_s: float | None = None) -> bool:
        return self.done.wait(timeout_s)


class CommitWriter:
    """One thread that writes staged commits in the order they were submitted (started on the first).

    ``write``: the file part (:func:`write_now`; tests pass a slow one). A failure is kept on its :class:`Pending`
    (``error``) for the filling thread to handle: :class:`pipefill_fill.store.Superseded` stops the slice, anything
    else fails the job."""

    def __init__(self, *, write: WriteFn = write_now, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._write, self._clock = write, clock
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
