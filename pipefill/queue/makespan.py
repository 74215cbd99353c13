"""``makespan``: finish the whole queue as early as possible (PipeFill's makespan-minimizing policy).

The queue finishes no sooner than its total work (dedicated-device seconds) divided by the useful work the ranks'
bubbles yield per second, and no sooner than its longest job. This policy attacks both:

* **Fit.** Every free slot is worth what its rank's bubble classes yield for the job placed there, in PipeFill's
  normalized work (:mod:`pipefill.queue.fit`). A rank's executor gives each class to the job that does the most
  normalized work in it (:func:`pipefill.plan.assign_jobs`), so a job added to a rank gains
  ``Σ_c max(0, v_c(job) − best v_c of the jobs already there)``. The pass takes (job, rank) pairs greedily by that
  gain, recomputed as ranks fill (a lazy greedy: gains only shrink), and places nothing where the gain is zero: a job
  that would only compete for classes others use as well stays queued for a rank it improves.
* **Longest first.** Jobs with the same profile and hosts are interchangeable for fit; among them the one with the
  most remaining dedicated-device time per pod it holds goes first (LPT), so long jobs start early and split across
  ``maxParallelRanks`` pods instead of ending last; a job without profile or estimate counts as longest.

Ties: the larger gain, then the rank's place (training jobs and ranks in name order), then the jobs' order by name.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from pipefill.queue.state import Group, Host, Job, State

__all__ = ["place_makespan"]

_EPS = 1e-12


@dataclass(eq=False)
class _Kind:
    """Jobs of one profile and one eligibility group, longest remaining time per pod first."""

    group: Group
    demand_id: int
    queue: list[tuple[tuple[Any, ...], int]] = field(default_factory=list)  # (LPT key, index into jobs)

    def key(self, job: Job) -> tuple[Any, ...]:
        work_s = job.demand.dedicated_s(job.remaining)
        per_pod = -math.inf if work_s is None else -work_s / (len(job.pods) + 1)
        return (per_pod, job.view.created_unix_s, job.view.namespace, job.view.name)


def place_makespan(state: State) -> None:
    kinds: dict[tuple[tuple[Any, ...], int], _Kind] = {}
    jobs = [j for j in state.jobs if j.open and j.allowance > 0]
    for idx, job in enumerate(jobs):
        kind = kinds.setdefault((job.group.key, job.demand_id), _Kind(job.group, job.demand_id))
        bisect.insort(kind.queue, (kind.key(job), idx))
    ordered = list(kinds.values())
    best: dict[int, list[float]] = {}  # per host with a free slot: per class, the best v_c of the jobs there
    for host in state.hosts:
        if host.load < state.max_jobs:
            b = [0.0] * len(host.cap.classes)
            for d in host.demand_ids:
                b = [max(x, v) for x, v in zip(b, state.rates.per_class(d, host.cap_id), strict=True)]
            best[host.order] = b
    heap: list[tuple[float, int, int]] = []
    for ki, kind in enumerate(ordered):
        for host in kind.group.hosts:
            if host.load < state.max_jobs:
                gain = _gain(state, kind.demand_id, host, best[host.order])
                if gain > 0:
                    heap.append((-gain, host.order, ki))
    heapq.heapify(heap)
    while heap:
        neg, order, ki = heapq.heappop(heap)
        host, kind = state.hosts[order], ordered[ki]
        if host.load >= state.max_jobs or not kind.queue:
            continue
        gain = _gain(state, kind.demand_id, host, best[order])
        if gain <= 0:
            continue
        if gain < -neg - _EPS:  # the rank took a job since this gain was computed
            heapq.heappush(heap, (-gain, order, ki))
            continue
        pos = next((p for p, (_, idx) in enumerate(kind.queue) if state.acceptable(jobs[idx], host)), None)
        if pos is None:
            continue
        _, idx = kind.queue.pop(pos)
        job = jobs[idx]
        state.place(job, host)
        rates = state.rates.per_class(job.demand_id, host.cap_id)
        best[order] = [max(x, v) for x, v in zip(best[order], rates, strict=True)]
        if job.open and job.allowance > 0:
            bisect.insort(kind.queue, (kind.key(job), idx))
        gain = _gain(state, kind.demand_id, host, best[order])
        if gain > 0 and host.load < state.max_jobs:
            heapq.heappush(heap, (-gain, order, ki))


def _gain(state: State, demand_id: int, host: Host, best: list[float]) -> float:
    rates = state.rates.per_class(demand_id, host.cap_id)
    return sum(max(0.0, v - b) for v, b in zip(rates, best, strict=True))
