"""Failure handling: a dead peer ends every rank within a bounded time, with an exit code the operator understands.

- A peer that dies closes its sockets: gloo/NCCL raise in the next receive or all-reduce, usually at once; a peer that
  hangs silently hits the process group's timeout (``PIPEFILL_COMM_TIMEOUT_S``).
- A :class:`Watchdog` thread ends the process if no step completes within the timeout plus a margin, for hangs
  outside torch.distributed (e.g. a wedged device).
- Exit codes (:mod:`pipefill.env`): 0 done; 2 invalid spec or environment (permanent: a restart cannot help);
  75 a peer failed or a rendezvous timed out (retryable: restart the job from the checkpoint); 143 stopped by SIGTERM
  after saving a checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from datetime import timedelta

from pipefill import env

__all__ = ["EXIT_SIGTERM", "PeerMonitor", "Watchdog", "peer_failure_message"]

EXIT_SIGTERM = 143


class Watchdog:
    """Exits the process with 75 when :meth:`beat` is not called for ``timeout_s`` seconds after :meth:`start`."""

    def __init__(self, *, timeout_s: float, rank: int) -> None:
        self.timeout_s, self.rank = timeout_s, rank
        self._last = time.monotonic()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        self._last = time.monotonic()  # a plain store: no lock on the training path

    def start(self) -> None:
        self._last = time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pipefill-watchdog", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(min(5.0, self.timeout_s / 4))
            silent = time.monotonic() - self._last
            if silent > self.timeout_s:
                print(
                    f"rank {self.rank}: no step completed for {silent:.0f} s (limit {self.timeout_s:.0f} s); "
                    f"a peer or the device hangs; exiting {env.EXIT_RETRYABLE} (retryable)",
                    flush=True,
                )
                os._exit(env.EXIT_RETRYABLE)


def peer_failure_message(*, rank: int, peers: list[int], where: str, error: BaseException) -> str:
    """Name the rank(s) that failed (when known) and what this rank was doing."""
    who = ("peer rank " + ", ".join(map(str, peers))) if peers else "a peer rank"
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"rank {rank}: {who} failed or became unreachable while {where} ({first_line}); "
        f"exiting {env.EXIT_RETRYABLE} (retryable: restart the job from its last checkpoint)"
    )


class PeerMonitor:
    """Every rank stamps a heartbeat into the rendezvous store each second; after a communication error the stale
    stamps name the rank that died (the error itself only names a socket). If the store is gone, rank 0 (its host)
    died."""

    def __init__(self, *, host: str, port: int, rank: int, world_size: int, period_s: float = 1.0) -> None:
        import torch.distributed as dist

        self.rank, self.world_size, self.period_s = rank, world_size, period_s
        self._store = dist.TCPStore(  # type: ignore[attr-defined]
            host, port, world_size, is_master=False, timeout=timedelta(seconds=10)
        )
        self._thread = threading.Thread(target=self._run, name="pipefill-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self._store.set(f"pipefill/heartbeat/{self.rank}", repr(time.time()))
            except Exception:  # the store's host died; dead_peers() reports it
                return
            time.sleep(self.period_s)

    def mark_exiting(self) -> None:
        with contextlib.suppress(Exception):  # the store's host may be the rank that died
            self._store.set(f"pipefill/exiting/{self.rank}", "1")

    def dead_peers(self, *, wait_s: float = 3.0) -> list[int]:
        """Ranks whose heartbeat is older than ``wait_s`` (waits that long first, so live peers can stamp)."""
        self.mark_exiting()
        time.sleep(wait_s)
        now, dead = time.time(), []
        try:
            for r in range(self.world_size):
                if r == self.rank or self._store.check([f"pipefill/exiting/{r}"]):
                    continue  # exited on its own after seeing the failure
                stamp = float(self._store.get(f"pipefill/heartbeat/{r}").decode())
                if now - stamp > max(2 * self.period_s, wait_s - 0.5):
                    dead.append(r)
        except Exception:
            return [0]
        return dead
