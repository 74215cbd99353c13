"""The reconcile queue: one entry per job, one worker on a job at a time, latest state wins.

kopf calls a handler per watch event, and a job has many (its own, each of its pods'), from several watch streams at
once. Handlers only :meth:`WorkQueue.add` the job's key; workers take keys off the queue and reconcile from a fresh
read. A key added while it is queued is not queued twice (a burst of pod events is one reconcile); a key added
while a worker is on it is queued again once the worker is done (no event is lost, and no job is reconciled by
two workers at once — controller-runtime's work queue does the same). Delayed adds serve deadlines, TTLs and retry
back-off. Batched adds gather a burst that a worker would otherwise take apart: the first add of a key opens a short
window, the key is queued when it closes, and the adds inside it are that one (the ranks of a gang report Running
within milliseconds of each other: one reconcile, not eight).

The queue lives on the event loop: its sets and the asyncio.Queue inside are not thread-safe, and a key put from
another thread can wake no worker or be lost between the sets. The handlers run on the loop; an :meth:`add` from
any other thread is handed to the loop (``call_soon_threadsafe``) rather than done there.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable

__all__ = ["Backoff", "WorkQueue"]


class WorkQueue:
    """Deduplicating FIFO of keys with per-key exclusivity and delayed adds."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Hashable] = asyncio.Queue()
        self._dirty: set[Hashable] = set()  # queued, or to queue again after processing
        self._processing: set[Hashable] = set()
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}
        self._batches: dict[Hashable, asyncio.TimerHandle] = {}  # open batch windows (see add_batched)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return self._queue.qsize()

    def bind(self) -> None:
        """Bind to the running loop (done by the first :meth:`get`): adds from other threads go to it."""
        self._loop, self._thread = asyncio.get_running_loop(), threading.get_ident()

    def add(self, key: Hashable) -> None:
        if self._loop is not None and threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self.add, key)
            return
        self._idle.clear()
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.put_nowait(key)

    def add_batched(self, key: Hashable, window_s: float) -> None:
        """Add ``key`` once ``window_s`` has passed since the first of the batched adds that found it neither queued
        nor in a window; the queue is not idle while a window is open."""
        if self._loop is not None and threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self.add_batched, key, window_s)
            return
        if key in self._batches or (key in self._dirty and key not in self._processing):
            return  # already on its way to a worker: this add is part of that reconcile
        self._idle.clear()
        self._batches[key] = asyncio.get_running_loop().call_later(max(window_s, 0.0), self._close_batch, key)

    def _close_batch(self, key: Hashable) -> None:
        self._batches.pop(key, None)
        self.add(key)

    def add_after(self, key: Hashable, delay_s: float) -> None:
        """Add ``key`` in ``delay_s`` seconds; an earlier pending add of the same key wins."""
        loop = asyncio.get_running_loop()
        when = loop.time() + max(delay_s, 0.0)
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled() and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> Hashable:
        """The next key; the caller owns it until :meth:`done`."""
        if self._loop is None:
            self.bind()
        key = await self._queue.get()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: Hashable) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.put_nowait(key)
        elif not self._dirty and not self._processing and not self._batches:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no key is queued, in a batch window or being processed (delayed adds not counted)."""
        await self._idle.wait()

    def forget(self, key: Hashable) -> None:
        """Drop a pending delayed add (the object is gone)."""
        for timers in (self._timers, self._batches):
            timer = timers.pop(key, None)
            if timer is not None:
                timer.cancel()
        if not self._dirty and not self._processing and not self._batches:
            self._idle.set()

    def close(self) -> None:
        for timers in (self._timers, self._batches):
            for timer in timers.values():
                timer.cancel()
            timers.clear()


class Backoff:
    """Per-key exponential back-off for unexpected errors: ``base_s`` doubling up to ``max_s``, reset on success."""

    def __init__(self, *, base_s: float = 0.5, max_s: float = 60.0) -> None:
        self.base_s, self.max_s = base_s, max_s
        self._failures: dict[Hashable, int] = {}

    def next_delay_s(self, key: Hashable) -> float:
        count = self._failures.get(key, 0)
        self._failures[key] = count + 1
        return float(min(self.max_s, self.base_s * 2**count))

    def reset(self, key: Hashable) -> None:
        self._failures.pop(key, None)
