"""Why a FillJob with work left runs nowhere after a pass, in the words its status condition will carry.

The checks follow the path a slice takes to a rank, and the first that rules out every rank is the reason: no
running training job in the namespace, hostSelector, ``spec.fill.enabled``, the training jobs' fill-job selectors,
their fill storage, ranks whose bubbles are unknown, slices still held by pods that have not terminated, unfit reports, bubbles that fit
no batch of the job, full ranks, and last the policy. Jobs of one eligibility group and profile share the answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pipefill.queue.fit import why_unfit
from pipefill.queue.state import Host, Job, State
from pipefill.spec.common import LabelSelector

__all__ = ["CODES", "Memo", "format_selector", "free_fitting_ranks", "why_waiting"]

_LIST_AT_MOST = 3

NO_MATCHING_HOST = "NoMatchingHost"
DRAINING = "WaitingForPodTermination"
UNFIT = "Unfit"
NO_FITTING_BUBBLE = "NoFittingBubble"
NO_FREE_RANK = "NoFreeRank"
POLICY = "QueuedByPolicy"
CODES = (NO_MATCHING_HOST, DRAINING, UNFIT, NO_FITTING_BUBBLE, NO_FREE_RANK, POLICY)
"""The CamelCase reason of the operator's Scheduled condition for each kind of wait (the text says the details)."""

Why = tuple[str, str]  # (code, text)


@dataclass
class Memo:
    """What jobs of one pass share: answers per (group, profile, unfit, pods), per group, free hosts per group and
    how many fit per (group, profile)."""

    reasons: dict[tuple[Any, ...], Why] = field(default_factory=dict)
    selectors: dict[tuple[Any, ...], str] = field(default_factory=dict)
    free: dict[tuple[Any, ...], _FreeRanks] = field(default_factory=dict)
    fitting: dict[tuple[Any, ...], int] = field(default_factory=dict)  # (group key, demand id) -> free ranks that fit


def why_waiting(state: State, job: Job, policy: str, memo: Memo) -> Why:
    """The reason ``job`` (open work, no pod of a running host) waits, as (code of :data:`CODES`, text); ``memo``
    shares answers within a pass."""
    if not job.open:
        return _draining(job)
    key = (job.group.key, job.demand_id, job.unfit, frozenset(job.pods), job.note)
    found = memo.reasons.get(key)
    if found is None:
        found = memo.reasons[key] = _funnel(state, job, policy, memo)
    return found


def _funnel(state: State, job: Job, policy: str, memo: Memo) -> Why:
    v = job.view
    prefix = memo.selectors.get(job.group.key)
    if prefix is None:
        prefix = memo.selectors[job.group.key] = _selectors(state, job)
    if prefix:
        return NO_MATCHING_HOST, prefix
    if job.allowance <= 0:
        return _draining(job)
    unfit = job.unfit
    if unfit and all((h.tj.name, h.rank.rank) in unfit for h in job.group.hosts):
        details = "; ".join(f"{u.training_job}/{u.rank}: {u.reason}" for u in v.unfit[:_LIST_AT_MOST])
        return UNFIT, f"every eligible rank reported this job unfit ({details})"
    fits = state.rates.fits
    free_fitting = free_fitting_ranks(state, job, memo)
    if free_fitting and policy == "makespan":
        return POLICY, job.note or (
            f"waiting: on the {free_fitting} free ranks that fit, other jobs use every bubble class the job could "
            "(makespan places a job only where it adds work)"
        )
    if free_fitting:
        return POLICY, f"waiting behind jobs ahead of it under policy {policy}"
    if unfit:
        somewhere = any(fits(job.demand_id, h.cap_id) for h in job.group.hosts if (h.tj.name, h.rank.rank) not in unfit)
    else:  # ranks of equal capacity answer alike
        somewhere = any(fits(job.demand_id, cap_id) for cap_id in job.group.by_cap)
    if somewhere:
        return NO_FREE_RANK, (
            f"waiting for a free rank: every rank whose bubbles fit runs {state.max_jobs} fill jobs already "
            "(PIPEFILL_FILL_MAX_ACTIVE_JOBS)"
        )
    reported = [h for h in job.group.hosts if (h.tj.name, h.rank.rank) not in unfit]
    h = reported[0]
    return NO_FITTING_BUBBLE, (
        f"no bubble class of the {len(reported)} eligible ranks fits the job ({h.name}: {why_unfit(job.demand, h.cap)})"
    )


def free_fitting_ranks(state: State, job: Job, memo: Memo) -> int:
    """How many free ranks of the job's group fit it, less those that reported it unfit and those it holds. Counted
    per rank capacity once per (group, profile), then corrected by the few ranks the job excludes: counting every
    free rank per waiting job made a pass quadratic (makespan leaves many jobs waiting beside free ranks)."""
    group, fits = job.group, state.rates.fits
    free = memo.free.get(group.key)
    if free is None:
        free = memo.free[group.key] = _FreeRanks.of(group.hosts, state.max_jobs)
    total = memo.fitting.get((group.key, job.demand_id))
    if total is None:
        total = sum(n for cap_id, n in free.by_cap.items() if fits(job.demand_id, cap_id))
        memo.fitting[group.key, job.demand_id] = total
    excluded = {id(h): h for name_rank in job.unfit for h in free.by_name_rank.get(name_rank, ())}
    excluded.update((id(h), h) for uid in job.pods for h in free.by_uid.get(uid, ()))
    return total - sum(1 for h in excluded.values() if fits(job.demand_id, h.cap_id))


@dataclass
class _FreeRanks:
    """A group's free ranks: how many per capacity, and each by (training job, rank) and by pod uid."""

    by_cap: dict[int, int] = field(default_factory=dict)
    by_name_rank: dict[tuple[str, int], list[Host]] = field(default_factory=dict)
    by_uid: dict[str, list[Host]] = field(default_factory=dict)

    @classmethod
    def of(cls, hosts: Iterable[Host], max_jobs: int) -> _FreeRanks:
        out = cls()
        for h in hosts:
            if h.load < max_jobs:
                out.by_cap[h.cap_id] = out.by_cap.get(h.cap_id, 0) + 1
                out.by_name_rank.setdefault((h.tj.name, h.rank.rank), []).append(h)
                out.by_uid.setdefault(h.rank.pod_uid, []).append(h)
        return out


def _selectors(state: State, job: Job) -> str:
    """The reason no rank admits any job of ``job``'s group (namespace, hostSelector, labels); "" when some does."""
    v = job.view
    ns = v.namespace
    running = [t for t in state.training_jobs if t.namespace == ns and t.running]
    if not running:
        return f"no PipelineTrainingJob is Running in namespace {ns}"
    matched = [t for t in running if v.host_selector.matches(dict(t.labels))]
    if not matched:
        return (
            f"hostSelector {format_selector(v.host_selector)} matches no running training job "
            f"({len(running)} running in namespace {ns}: {_names(t.name for t in running)})"
        )
    enabled = [t for t in matched if t.fill_enabled]
    if not enabled:
        return f"fill is disabled (spec.fill.enabled: false) on every training job hostSelector matches: {_names(t.name for t in matched)}"
    admitted = [t for t in enabled if t.fill_job_selector.matches(dict(v.labels))]
    if not admitted:
        t = enabled[0]
        return (
            f"the fill-job selector of every matching training job refuses this job's labels "
            f"{format_labels(v.labels)} ({t.name} admits {format_selector(t.fill_job_selector)})"
        )
    stored = [t for t in admitted if t.fill_storage_claim == v.storage_claim]
    if not stored:
        t = admitted[0]
        want = f"claim {v.storage_claim}" if v.storage_claim else "no claim"
        has = f"claim {t.fill_storage_claim}" if t.fill_storage_claim else "none"
        return (
            f"no matching training job's fill storage holds this job: its output is on {want} "
            f"({t.name}'s spec.fill.storage: {has}); use a training job whose spec.fill.storage.claimName is "
            "spec.output.claimName"
        )
    return ""


def _draining(job: Job) -> Why:
    held = ", ".join(f"[{p.start}, {p.end}) on {p.pod}" for p in job.kept[:_LIST_AT_MOST])
    return DRAINING, f"slices {held} wait for their pods to terminate before they move"


def format_selector(selector: LabelSelector) -> str:
    """``{a=b, c In (x,y)}``, or ``{}`` for the empty selector (which matches everything)."""
    parts = [f"{k}={val}" for k, val in sorted(selector.match_labels.items())]
    for r in selector.match_expressions:
        parts.append(f"{r.key} {r.operator}" + (f" ({','.join(r.values)})" if r.values else ""))
    return "{" + ", ".join(parts) + "}"


def format_labels(labels: Any) -> str:
    return "{" + ", ".join(f"{k}={val}" for k, val in sorted(dict(labels).items())) + "}"


def _names(names: Iterable[str]) -> str:
    items = list(names)
    more = f" and {len(items) - _LIST_AT_MOST} more" if len(items) > _LIST_AT_MOST else ""
    return ", ".join(items[:_LIST_AT_MOST]) + more
