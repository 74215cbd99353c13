"""The queue's policies: the order in which jobs take free rank slots (``fifo``, ``priority``, ``sjf``, ``deadline``)
and where each slice goes; ``makespan`` decides differently (:mod:`pipefill.queue.makespan`).

Every order ends in the same tie-break — creation time, then namespace and name — so equal inputs give equal passes.

* ``fifo``: creation order.
* ``priority``: higher ``spec.priority`` first.
* ``sjf``: shortest remaining work first: the remaining units on a dedicated device, from the measured profile (best
  throughput over batch sizes: step time × remaining batches), else from the spec's estimate (one unit per step of
  ``estimates.stepMilliseconds``); a job with neither goes after every job with one.
* ``deadline``: higher priority first and, among equal priorities, earliest ``spec.deadline`` first (the order the
  FillJob field documents); jobs without a deadline after those with one.

A job takes as many slices as it has open, up to ``maxParallelRanks`` pods, each on the least loaded acceptable pod
(fewest fill jobs; among equals the one that reached that load first, training jobs and ranks in name order).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

from pipefill.queue.state import Host, Job, State

__all__ = ["POLICIES", "Policy", "place_in_order"]


class Policy(enum.StrEnum):
    FIFO = "fifo"
    PRIORITY = "priority"
    SJF = "sjf"
    DEADLINE = "deadline"
    MAKESPAN = "makespan"


POLICIES: tuple[str, ...] = tuple(p.value for p in Policy)


def _tie(job: Job) -> tuple[float, str, str]:
    v = job.view
    return (v.created_unix_s, v.namespace, v.name)


def _sjf(job: Job) -> tuple[float | str, ...]:
    work_s = job.demand.dedicated_s(job.remaining)
    return (math.inf if work_s is None else work_s, *_tie(job))


def _deadline(job: Job) -> tuple[float | str, ...]:
    deadline = job.view.deadline_unix_s
    return (-job.view.priority, math.inf if deadline is None else deadline, *_tie(job))


_KEYS: dict[Policy, Callable[[Job], tuple[float | str, ...]]] = {
    Policy.FIFO: _tie,
    Policy.PRIORITY: lambda job: (-job.view.priority, *_tie(job)),
    Policy.SJF: _sjf,
    Policy.DEADLINE: _deadline,
}


def place_in_order(state: State, policy: Policy) -> None:
    """Jobs in the policy's order, each taking least loaded acceptable pods for its open slices."""
    for job in sorted(state.jobs, key=_KEYS[policy]):
        while job.open and job.allowance > 0:
            host = _least_loaded(state, job)
            if host is None:
                break
            state.place(job, host)


def _least_loaded(state: State, job: Job) -> Host | None:
    for level, bucket in enumerate(job.group.buckets):
        while bucket and bucket[0].load != level:  # moved up since it entered this bucket
            bucket.popleft()
        for host in bucket:
            if host.load == level and state.acceptable(job, host):
                return host
    return None
