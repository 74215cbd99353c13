"""Status reports off the filling thread: a slow or dead API server never delays a fill step, and no report is lost.

The executor's working thread fills bubbles; a status report is a GET and a PATCH, which take milliseconds on a
healthy API server and, on a slow or unreachable one, as long as the client waits. So :meth:`Reporter.submit` only
queues the report and returns; one daemon thread sends them. Reports of one job that pile up while a request is in
flight, or while the server does not answer, are sent together: the send applies each, in the order they were made,
to the status it read (``send(name, reports)``), and makes one PATCH — so a burst costs one round trip and nothing
any of them said is dropped (final phases, commit pointers, unfit entries, profiles: each merged in turn).

A send that fails for a reason that may pass (a timeout, a refused connection, 429, a 5xx) keeps its reports at the
front of the job's queue and is tried again after a wait that doubles up to :data:`MAX_BACKOFF_S`, for as long as the
executor runs; a permanent answer (403, 404: the job is gone, 422) drops them with a warning — progress itself is
durable in the job's storage, and the next report carries it all again. :meth:`Reporter.close` sends what is left,
for at most ``timeout_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pipefill.queue.status import ProgressReport

__all__ = ["MAX_BACKOFF_S", "Reporter", "Transient"]

log = logging.getLogger("pipefill_fill")

MAX_BACKOFF_S = 5.0
"""the longest wait between tries of a send that failed for a reason that may pass"""
FIRST_BACKOFF_S = 0.1


class Transient(Exception):
    """Raised by ``send`` when the API server did not answer or answered "later": the reports are tried again."""


class Reporter:
    """``submit(name, report)`` from any thread; a daemon thread calls ``send(name, reports)`` (the reports of one job
    not yet sent, oldest first), which raises :class:`Transient` to have them tried again."""

    def __init__(self, send: Callable[[str, list[ProgressReport]], None], *, name: str = "status-reporter") -> None:
        self._send = send
        self._pending: dict[str, list[ProgressReport]] = {}  # job -> reports not yet sent, oldest first
        self._cond = threading.Condition()
        self._busy = 0  # reports in the send in flight (out of _pending)
        self._stopping = False
        self._backoff_s = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, name: str, report: ProgressReport) -> None:
        """Queue ``report`` of job ``name``; returns at once."""
        with self._cond:
            self._pending.setdefault(name, []).append(report)
            self._cond.notify_all()

    def pending(self) -> int:
        """Reports queued or in flight."""
        with self._cond:
            return sum(map(len, self._pending.values())) + self._busy

    def flush(self, timeout_s: float) -> bool:
        """Wait until every report submitted so far was sent (or dropped as permanent); whether it was in time."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is left for at most ``timeout_s``, then stop the thread (what is still unsent is logged)."""
        sent = self.flush(timeout_s)
        with self._cond:
            self._stopping = True
            left = {n: len(r) for n, r in self._pending.items()}
            self._cond.notify_all()
        self._thread.join(timeout=1.0)
        if not sent and left:
            log.warning("status reports not sent before exit (the API server did not answer): %s", left)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                name = next(iter(self._pending))
                reports = self._pending.pop(name)
                self._busy = len(reports)
            retry = False
            try:
                self._send(name, reports)
                self._backoff_s = 0.0
            except Transient as exc:
                retry = True
                self._backoff_s = min(MAX_BACKOFF_S, max(FIRST_BACKOFF_S, 2 * self._backoff_s))
                log.warning(
                    "status of FillJob %s not sent (%s): %d report(s) kept, next try in %.1f s",
                    name,
                    exc,
                    len(reports),
                    self._backoff_s,
                )
            except Exception:  # a bug in a send must not end the thread: the reports are dropped, loudly
                log.exception("status of FillJob %s: %d report(s) dropped", name, len(reports))
            with self._cond:
                if retry:  # in front of what was submitted meanwhile: the order of one job's reports stays
                    self._pending[name] = reports + self._pending.get(name, [])
                self._busy = 0
                self._cond.notify_all()
                if retry:
                    self._cond.wait_for(lambda: self._stopping, timeout=self._backoff_s)
