"""``makespan``: finish the whole queue as early as possible (PipeFill's makespan-minimizing policy).

The queue finishes no sooner than its total work (dedicated-device seconds) divided by the useful work the ranks'
bubbles yield per second, and no sooner than its longest job. The pass is list scheduling that attacks both:

* **Useful work, in one unit.** A rank's worth to a job is PipeFill's normalized work (:mod:`pipefill.queue.fit`).
  A rank's executor gives each bubble class to one job (:func:`pipefill.plan.assign_jobs`), so a job added to a
  rank gains ``Σ v_c(job)`` over the classes no job there uses yet; nothing is placed where that gain is zero (the
  job would only compete for classes another job has, and stall it or be stalled).
* **Longest first (LPT).** Jobs are considered in the order of their remaining wall time per pod they would hold
  (dedicated-device time ÷ the normalized work per second their fastest rank offers), longest first, so long jobs
  start early and spread over ``maxParallelRanks`` pods instead of ending last. A job with neither profile nor
  estimate counts as longest, so it is profiled early.
* **Earliest completion (MCT).** Each slice goes where it would finish first: on the free rank with the best score,
  or — when that is sooner — on one of the job's fastest ranks once the first slice running there ends (its ready
  time). In the second case the slice waits and the rank is booked for this pass, so shorter jobs behind it in
  LPT order do not take the rank it waits for; the next pass decides again from new facts.
* **Leave ranks to those who need them.** A free rank's score is the job's gain there minus its *opportunity*: the
  largest gain any other kind of queued job would have there. A job that is as good everywhere leaves the ranks
  others need (a small model takes the short bubbles and leaves the long ones to a large model).

Jobs of one kind (the same profile and hosts) share rank scores, kept in lazy heaps (a rank's score only falls as it
takes jobs; a ready time only grows with bookings). Ties: the higher score or earlier ready time, then the rank's
place (training jobs and ranks in name order), then creation time and name of the jobs.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipefill.queue.state import Group, Host, Job, State

__all__ = ["place_makespan"]

_EPS = 1e-12
_FASTEST = 0.95
"""Ranks within this fraction of a kind's fastest rank count among its fastest (for waiting on one)."""
_WORTH_WAITING = 0.9
"""A slice waits for (or moves to) a fastest rank only if it would finish there in under this fraction of the time."""


@dataclass(eq=False)
class _Kind:
    """Jobs of one profile and eligibility group: their free ranks by score, their fastest ranks by ready time."""

    job: Job  # any member: they share hosts and rates
    free: list[tuple[float, int]] = field(default_factory=list)  # (-score, host order)
    fast: list[tuple[float, int]] = field(default_factory=list)  # (ready_s, host order)
    speed: dict[int, float] = field(default_factory=dict)  # host order -> Σ v_c (alone on it), of its fastest hosts
    fastest: float = 0.0


def place_makespan(state: State) -> None:
    jobs = [j for j in state.jobs if j.open and j.allowance > 0]
    ids: dict[tuple[tuple[Any, ...], int], int] = {}
    kind_of = [ids.setdefault((j.group.key, j.demand_id), len(ids)) for j in jobs]
    kinds: dict[int, _Kind] = {}
    for job, ki in zip(jobs, kind_of, strict=True):
        kinds.setdefault(ki, _Kind(job))
    best = {h.order: _best_per_class(state, h) for h in state.hosts if h.load < state.max_jobs}
    ready = {h.order: _ready_s(state, h) for h in state.hosts}
    gains = _initial_gains(state, kinds, best)
    top2: dict[int, list[tuple[float, int]]] = {}  # host -> its two largest (gain, kind)
    for (ki, order), gain in gains.items():
        top = top2.setdefault(order, [])
        top.append((gain, ki))
        top.sort(reverse=True)
        del top[2:]

    def opportunity(ki: int, order: int) -> float:
        return next((g for g, k in top2.get(order, ()) if k != ki), 0.0)

    for (ki, order), gain in gains.items():
        kinds[ki].free.append((-(gain - opportunity(ki, order)), order))
    for kind in kinds.values():
        heapq.heapify(kind.free)
        kind.fast = [(ready[o], o) for o, v in kind.speed.items() if v >= _FASTEST * kind.fastest]
        heapq.heapify(kind.fast)
    for idx in sorted(range(len(jobs)), key=lambda i: _lpt(jobs[i], kinds[kind_of[i]].fastest)):
        job, ki = jobs[idx], kind_of[idx]
        kind = kinds[ki]
        while job.open and job.allowance > 0:
            host = _best_free(state, job, kind, best, functools.partial(opportunity, ki))
            work_s = job.demand.dedicated_s(job.open[0].remaining)
            wait = _soonest_fast(state, job, kind, ready) if work_s is not None else None
            if wait is not None and wait is not host and work_s is not None:
                now_s = math.inf if host is None else work_s / _gain(state, job.demand_id, host, best[host.order])
                gain = _gain(state, job.demand_id, wait, best[wait.order]) if wait.order in best else 0.0
                if gain > 0 and state.acceptable(job, wait):
                    if work_s / gain < _WORTH_WAITING * now_s:
                        host = wait  # one of its fastest ranks is free and much faster: take it
                else:
                    wait_s = ready[wait.order] + work_s / kind.speed[wait.order]
                    if wait_s < _WORTH_WAITING * now_s:
                        ready[wait.order] = wait_s  # booked: the slice waits for this rank
                        job.note = (
                            f"waiting for rank {wait.name}: it finishes the job sooner once free than any free rank "
                            "would (makespan)"
                        )
                        heapq.heappush(kind.fast, (wait_s, wait.order))
                        break
            if host is None:
                break
            state.place(job, host)
            rates = state.rates.per_class(job.demand_id, host.cap_id)
            best[host.order] = [max(x, v) for x, v in zip(best[host.order], rates, strict=True)]
            if work_s is not None:
                ready[host.order] = min(ready[host.order], work_s / state.rates.speed(job.demand_id, host.cap_id))


def _initial_gains(state: State, kinds: dict[int, _Kind], best: dict[int, list[float]]) -> dict[tuple[int, int], float]:
    """Each kind's gain on every free host of its group, its fastest speed and its fastest hosts (``kind.speed``).

    A gain depends on the job's demand and the host, not on the kind's group: it is computed once per demand for
    the hosts with a free slot and something to give (every class where nothing runs, else the classes no job there
    uses yet), and each kind of that demand takes those of its group. A kind's fastest hosts come from its demand's
    rank capacities by speed, walked from the fastest of its group down to :data:`_FASTEST` of it."""
    hosts = state.hosts
    open_classes: dict[int, tuple[int, ...] | None] = {}  # host order -> its classes no job uses yet; None: all
    for order, b in best.items():
        host = hosts[order]
        if not host.work:
            open_classes[order] = None
        elif host.cap.known:  # a rank whose bubbles are not known takes one job at a time (_gain: 0)
            free = tuple(i for i, x in enumerate(b) if x <= 0)
            if free:
                open_classes[order] = free
    groups: dict[int, dict[Group, None]] = {}  # demand id -> the groups of its kinds (ordered, each once)
    for kind in kinds.values():
        groups.setdefault(kind.job.demand_id, {})[kind.job.group] = None
    by_demand = {d: _demand_gains(state, d, list(gs), open_classes) for d, gs in groups.items()}
    members: dict[Group, set[int]] = {}  # a group's host orders
    gains: dict[tuple[int, int], float] = {}
    for ki, kind in kinds.items():
        d, group = kind.job.demand_id, kind.job.group
        ranked, positive = by_demand[d]
        by_cap = group.by_cap
        for speed, cap_id in ranked:  # fastest first
            if cap_id not in by_cap:
                continue
            if not kind.fastest:
                kind.fastest = speed
            elif speed < _FASTEST * kind.fastest:
                break
            for host in by_cap[cap_id]:
                kind.speed[host.order] = speed
        inside = members.get(group)
        if inside is None:
            inside = members[group] = {h.order for h in group.hosts}
        gains.update(((ki, order), gain) for order, gain in positive if order in inside)
    return gains


def _demand_gains(
    state: State, demand_id: int, groups: list[Group], open_classes: dict[int, tuple[int, ...] | None]
) -> tuple[list[tuple[float, int]], list[tuple[int, float]]]:
    """For one demand: the rank capacities of ``groups`` (those of its kinds) where it runs, fastest first (``(speed,
    cap id)``), and the hosts with such a capacity where it would gain something now (``(host order, gain)``; a host
    of another group may share a capacity: each kind keeps those of its own group)."""
    rates = state.rates
    speeds = {c: rates.speed(demand_id, c) for g in groups for c in g.by_cap}
    ranked = sorted(((s, c) for c, s in speeds.items() if s > 0), key=lambda sc: (-sc[0], sc[1]))
    positive = []
    for order, free in open_classes.items():
        cap_id = state.hosts[order].cap_id
        speed = speeds.get(cap_id, 0.0)  # 0: no group here has its capacity, or the demand does not fit it
        if speed <= 0:
            continue
        if free is None:
            gain = speed
        else:
            per_class = rates.per_class(demand_id, cap_id)
            gain = sum(per_class[i] for i in free)
        if gain > 0:
            positive.append((order, gain))
    return ranked, positive


def _best_free(
    state: State, job: Job, kind: _Kind, best: dict[int, list[float]], opportunity: Callable[[int], float]
) -> Host | None:
    """The acceptable free host with the best score, re-scoring stale heap entries; entries the job cannot use (it
    holds the pod already or was reported unfit there) stay for the kind's other jobs."""
    skipped, found = [], None
    while kind.free:
        neg, order = heapq.heappop(kind.free)
        host = state.hosts[order]
        if host.load >= state.max_jobs:
            continue
        gain = _gain(state, job.demand_id, host, best[order])
        if gain <= 0:
            continue
        score = gain - opportunity(order)
        if score < -neg - _EPS:
            heapq.heappush(kind.free, (-score, order))
            continue
        skipped.append((neg, order))  # stays a candidate (it may take another job of the kind)
        if state.acceptable(job, host):
            found = host
            break
    for entry in skipped:
        heapq.heappush(kind.free, entry)
    return found


def _soonest_fast(state: State, job: Job, kind: _Kind, ready: dict[int, float]) -> Host | None:
    """Among the kind's fastest hosts the one ready soonest that the job may use (stale entries re-queued)."""
    skipped, found = [], None
    while kind.fast:
        at, order = heapq.heappop(kind.fast)
        if at < ready[order] - _EPS:
            heapq.heappush(kind.fast, (ready[order], order))
            continue
        skipped.append((at, order))
        host = state.hosts[order]
        if host.rank.pod_uid not in job.pods and (host.tj.name, host.rank.rank) not in job.unfit:
            found = host
            break
    for entry in skipped:
        heapq.heappush(kind.fast, entry)
    return found


def _ready_s(state: State, host: Host) -> float:
    """Seconds until the host's first slice ends (at its speed there alone); 0 with a free slot and nothing there."""
    times = []
    for demand_id, units in host.work:
        speed = state.rates.speed(demand_id, host.cap_id)
        work_s = state.rates.demands[demand_id].dedicated_s(units)
        times.append(math.inf if work_s is None or speed <= 0 else work_s / speed)
    return min(times, default=0.0)


def _best_per_class(state: State, host: Host) -> list[float]:
    """Per class, the best ``v_c`` of the jobs the host runs."""
    b = [0.0] * len(host.cap.classes)
    for demand_id, _ in host.work:
        b = [max(x, v) for x, v in zip(b, state.rates.per_class(demand_id, host.cap_id), strict=True)]
    return b


def _lpt(job: Job, fastest: float) -> tuple[float, float, str, str]:
    """Longest first: remaining wall time per pod on the fastest rank; unknown work (or no rank) counts as longest."""
    work_s = job.demand.dedicated_s(job.remaining)
    wall_s = math.inf if work_s is None or fastest <= 0 else work_s / fastest / (len(job.pods) + 1)
    return (-wall_s, job.view.created_unix_s, job.view.namespace, job.view.name)


def _gain(state: State, demand_id: int, host: Host, best: list[float]) -> float:
    """Normalized work per second the job adds on ``host``: its classes that no job there uses yet. (A class some job
    uses already is not counted even where the newcomer is better: the executor would hand it over and stall the
    job that has it, trading one job's progress for a little more of another's.)"""
    if not host.cap.known:  # one job at a time on a rank whose bubbles are not known yet
        return 0.0 if host.work else state.rates.speed(demand_id, host.cap_id)
    rates = state.rates.per_class(demand_id, host.cap_id)
    return sum(v for v, b in zip(rates, best, strict=True) if b <= 0)
