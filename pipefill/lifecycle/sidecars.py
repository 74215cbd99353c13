"""When a rank's fill executor that exited is started again: the sidecar's restart rule, decided in the core.

On a cluster the fill executor is a native sidecar (``restartPolicy: Always``) and the kubelet restarts it; the
operator only observes it (:attr:`~pipefill.lifecycle.observe.PodView.fill_restarts`) and never sees a
:class:`FillExit`. ``pipefill local`` plays the kubelet: it reports each executor that exited as a :class:`FillExit`
and starts it again when :func:`decide` says so (``Decision.restart_fill``). The rule is the sidecar's: training
goes on whatever the executor does, and an executor is not started again

* once its rank's trainer has ended (its pod's sidecars end with the trainer), or
* when it left because its trainer stopped announcing (its last ``exit`` record says "trainer gone"): the trainer is
  finishing (its final save) or hangs, and then its peers' timeout restarts the whole job, which starts the executor
  again; restarting it would attach to a channel nobody announces on.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from pipefill.lifecycle.exitcodes import exit_text
from pipefill.lifecycle.observe import FillExit, PodView

__all__ = ["FILL_RESTART_BACKOFF_S", "FillExit", "fill_restarts_due", "restarted_text"]

FILL_RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
"""Seconds from an executor's exit to its next start, by how often it restarted in this generation (the last value
from then on): a crash loop costs little CPU, a single crash little fill time."""


def fill_restarts_due(pods: Sequence[PodView], now: datetime.datetime) -> tuple[list[int], float | None]:
    """The ranks of ``pods`` (one generation's) whose fill executor starts again now, and the seconds until the next
    one is due (None: none waits)."""
    due: list[int] = []
    wait_s: float | None = None
    for pod in pods:
        end = pod.fill_exit
        if end is None or pod.trainer is not None or end.left_with_trainer:
            continue
        backoff_s = FILL_RESTART_BACKOFF_S[min(pod.fill_restarts, len(FILL_RESTART_BACKOFF_S) - 1)]
        left_s = (end.at - now).total_seconds() + backoff_s
        if left_s <= 0:
            due.append(pod.rank)
        else:
            wait_s = left_s if wait_s is None else min(wait_s, left_s)
    return sorted(due), wait_s


def restarted_text(pod: PodView) -> str:
    """How often ``pod``'s fill executor restarted and how it last ended, for the FillExecutorRestarted Event."""
    last = "" if pod.fill_last_exit is None else f", last {exit_text(pod.fill_last_exit)}"
    return f"rank {pod.rank}: {pod.fill_restarts}{last}"
