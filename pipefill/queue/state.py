"""The working state of one pass: the rank pods that may host fill work and the jobs with work left, built from a
:class:`~pipefill.queue.snapshot.Snapshot`, and the one operation that changes it (placing a slice on a pod).

What carries over from the snapshot's assignments: a placement stays while its pod has not terminated — whatever
happened to the training job since — because the executor there may still commit into the slice; it is dropped when
the pod is gone (the slice returns to the queue and resumes from its commit pointer), when the slice is done, or when
that rank reported the job unfit (its executor let go of the job).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pipefill.queue.fit import Demand, RankCapacity, Rates
from pipefill.queue.predict import PredictedRank, predict_ranks
from pipefill.queue.slices import plan_bounds
from pipefill.queue.snapshot import FillJobView, Placement, RankView, SliceStatus, Snapshot, TrainingJobView
from pipefill.queue.snapshot import selector_key as _selector_key
from pipefill.schedules import ScheduleError

__all__ = ["FINISHING_LEAD_S", "Group", "Host", "Job", "State"]


@dataclass(eq=False)
class Host:
    """A rank pod of a running, fill-enabled training job; ``order``: its place in the deterministic tie-break."""

    order: int
    tj: TrainingJobView
    rank: RankView
    cap: RankCapacity
    cap_id: int
    jobs: set[tuple[str, str]] = field(default_factory=set)
    work: list[tuple[int, int]] = field(default_factory=list)  # (demand id, remaining units) of the slices placed here
    groups: list[Group] = field(default_factory=list)
    finishing: int = 0  # of its kept slices, those expected done within FINISHING_LEAD_S (see State._occupy)
    load: int = 0  # slots taken: len(jobs), less one while a kept slice is finishing; read in every inner loop

    @property
    def name(self) -> str:
        return f"{self.tj.name}/{self.rank.rank}"


@dataclass(eq=False)
class Group:
    """Jobs that may run on the same hosts (same namespace, hostSelector and labels) and those hosts; ``buckets[L]``:
    hosts that had ``L`` jobs when they entered it, in the order they did (stale entries are skipped)."""

    key: tuple[Any, ...]
    hosts: list[Host]
    buckets: list[deque[Host]]
    by_cap: dict[int, list[Host]] = field(default_factory=dict)  # hosts of equal bubble capacity share rates


@dataclass(eq=False)
class Job:
    """A FillJob with work left, its plan, the placements kept from the snapshot and those made in this pass."""

    view: FillJobView
    demand: Demand
    demand_id: int
    slices: tuple[SliceStatus, ...]
    planned_now: bool
    group: Group
    unfit: frozenset[tuple[str, int]]
    kept: list[Placement] = field(default_factory=list)
    released: list[Placement] = field(default_factory=list)
    new: list[Placement] = field(default_factory=list)
    open: deque[SliceStatus] = field(default_factory=deque)
    pods: set[str] = field(default_factory=set)
    epoch: int = 0
    note: str = ""  # why a policy chose to let it wait (makespan)

    @property
    def allowance(self) -> int:
        return self.view.parallel_ranks - len(self.pods)

    @property
    def remaining(self) -> int:
        return sum(s.remaining for s in self.slices)


FINISHING_LEAD_S = 30.0
"""A kept slice expected done within this many seconds (its units left at the job's speed on that rank alone) frees
one slot of its rank now, once per rank however many finish: the next job is assigned before the slot falls free, and
the executor, which takes one job more while one is finishing (``pipefill_fill.jobs.Jobs.room``), prepares it (profile
from the shared cache, first calls) between bubbles, so the switch waits neither for a pass nor for a start-up. The
operator's pass runs at least this often (``--fill-period``)."""


class State:
    """Hosts and jobs of one pass; ``max_jobs`` per host (``PIPEFILL_FILL_MAX_ACTIVE_JOBS``)."""

    def __init__(self, snapshot: Snapshot, *, max_jobs: int, rates: Rates) -> None:
        if max_jobs < 1:
            raise ValueError(f"max_jobs_per_rank: {max_jobs} must be ≥ 1 fill job per rank")
        self.max_jobs, self.rates = max_jobs, rates
        self.live = snapshot.live()
        self.training_jobs = sorted(snapshot.training_jobs, key=lambda t: t.key)
        self.hosts: list[Host] = []
        for tj in self.training_jobs:
            if tj.running and tj.fill_enabled:
                self._add_hosts(tj)
        by_uid = {h.rank.pod_uid: h for h in self.hosts}
        self.by_uid = by_uid
        self._groups: dict[tuple[Any, ...], Group] = {}
        self.jobs: list[Job] = []
        self.inactive: list[FillJobView] = []
        for view in sorted(snapshot.fill_jobs, key=lambda j: j.key):
            if view.active:
                self.jobs.append(self._job(view))
            else:
                self.inactive.append(view)

    def _add_hosts(self, tj: TrainingJobView) -> None:
        predicted: tuple[PredictedRank, ...] | None = None
        for r in sorted(tj.ranks, key=lambda r: r.rank):
            classes, step_s = r.bubble_classes, r.step_s
            if (not classes or step_s is None) and tj.spec is not None:
                if predicted is None:
                    try:
                        predicted = predict_ranks(tj.spec, schedule_csv=tj.schedule_csv)
                    except (ValueError, ScheduleError):  # a custom schedule without its CSV
                        predicted = ()
                guess = predicted[r.rank % len(predicted)] if predicted else None
                if guess is not None:
                    classes, step_s = classes or guess.classes, step_s if step_s is not None else guess.step_s
            if classes and step_s is not None:
                cap = RankCapacity(tuple(classes), step_s, tj.guard_s)
            else:  # nothing reported, nothing predicted worth announcing: learn by placing (unfit reports correct it)
                cap = RankCapacity((), 1.0, tj.guard_s, known=False)
            self.hosts.append(Host(len(self.hosts), tj, r, cap, self.rates.cap_id(cap)))

    def _job(self, view: FillJobView) -> Job:
        slices = view.slices
        planned_now = not slices
        if planned_now:
            planned = plan_bounds(view.total, parallel_ranks=view.parallel_ranks, min_units=view.min_slice_units)
            slices = tuple(SliceStatus(a, b, a) for a, b in itertools.pairwise(planned))
        demand, demand_id = self.rates.demand_id_of(view)
        job = Job(
            view,
            demand,
            demand_id,
            slices,
            planned_now,
            self.group(view),
            frozenset((u.training_job, u.rank) for u in view.unfit),
            epoch=view.epoch,
        )
        # Every slice committed, the job not final: an executor still has to complete it (assemble the outputs, call
        # the workload's finalize) and report Succeeded. One placement of a done slice stays (or the last slice is
        # placed) so that some executor does, also when the one that committed last died before completing.
        completing = bool(slices) and all(s.done for s in slices)
        held: set[tuple[int, int]] = set()
        if view.assignments:
            by_bounds = {(s.start, s.end): s for s in slices}
            for a in sorted(view.assignments, key=lambda a: (a.start, a.epoch)):
                bounds = (a.start, a.end)
                gone = a.pod_uid not in self.live or (a.training_job, a.rank) in job.unfit
                finished = by_bounds[bounds].done and not (completing and not job.kept)
                if gone or finished or bounds in held or a.pod_uid in job.pods:
                    job.released.append(a)
                    continue
                job.kept.append(a)
                held.add(bounds)
                job.pods.add(a.pod_uid)
                host = self.by_uid.get(a.pod_uid)
                if host is not None:
                    self._occupy(host, job, by_bounds[bounds], kept=True)
        started: list[SliceStatus] = []  # started slices first: resume before fresh work
        fresh: list[SliceStatus] = []
        for s in slices:
            if s.committed < s.end and (s.start, s.end) not in held:
                (fresh if s.committed == s.start else started).append(s)
        job.open = deque(started + fresh)
        if completing and not job.kept:
            job.open.append(slices[-1])
        return job

    def group(self, view: FillJobView) -> Group:
        """The eligibility group of ``view``, built on first use."""
        key = (
            view.namespace,
            _selector_key(view.host_selector),
            tuple(sorted(view.labels.items())),
            view.storage_claim,
        )
        found = self._groups.get(key)
        if found is not None:
            return found
        labels = dict(view.labels)
        admits: dict[tuple[str, str], bool] = {}
        for t in self.training_jobs:  # selectors per training job, not per rank
            admits[t.key] = (
                t.namespace == view.namespace
                and view.host_selector.matches(dict(t.labels))
                and t.fill_job_selector.matches(labels)
                and t.fill_storage_claim == view.storage_claim
            )
        hosts = [h for h in self.hosts if admits[h.tj.key]]
        buckets: list[deque[Host]] = [deque() for _ in range(self.max_jobs)]
        for h in hosts:
            if h.load < self.max_jobs:
                buckets[h.load].append(h)
        group = Group(key, hosts, buckets)
        for h in hosts:
            h.groups.append(group)
            group.by_cap.setdefault(h.cap_id, []).append(h)
        self._groups[key] = group
        return group

    def acceptable(self, job: Job, host: Host) -> bool:
        """Whether ``host`` may take a slice of ``job`` now: a free slot, not holding the job already, not reported
        unfit for it, and some bubble class fits the job."""
        return (
            host.load < self.max_jobs
            and host.rank.pod_uid not in job.pods
            and (host.tj.name, host.rank.rank) not in job.unfit
            and self.rates.fits(job.demand_id, host.cap_id)
        )

    def place(self, job: Job, host: Host) -> Placement:
        """Give ``job``'s next open slice to ``host`` with the job's next epoch."""
        s = job.open.popleft()
        job.epoch += 1
        p = Placement(
            job.view.name, s.start, s.end, host.tj.name, host.rank.rank, host.rank.pod, host.rank.pod_uid, job.epoch
        )
        job.new.append(p)
        job.pods.add(host.rank.pod_uid)
        self._occupy(host, job, s)
        return p

    def finishing(self, job: Job, host: Host, s: SliceStatus) -> bool:
        """Whether slice ``s`` of ``job`` will be done on ``host`` within :data:`FINISHING_LEAD_S` at the job's speed
        there alone (known only for a job with a profile or estimate on a rank whose bubbles are known)."""
        left_s = job.demand.dedicated_s(s.remaining)
        speed = self.rates.speed(job.demand_id, host.cap_id)
        return host.cap.known and left_s is not None and speed > 0 and left_s / speed <= FINISHING_LEAD_S

    def _occupy(self, host: Host, job: Job, s: SliceStatus, *, kept: bool = False) -> None:
        host.jobs.add(job.view.key)
        if kept and self.finishing(job, host, s):  # only a slice that runs already: a new one has yet to start
            host.finishing += 1
        host.load = len(host.jobs) - min(1, host.finishing)  # one early slot per rank (#30 item 5)
        host.work.append((job.demand_id, s.remaining))
        if host.load < self.max_jobs:
            for g in host.groups:
                g.buckets[host.load].append(host)
