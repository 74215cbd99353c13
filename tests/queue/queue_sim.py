"""A pure, seeded simulated cluster for the queue's tests: rank pods with bubble classes, a queue of FillJobs, and
time that advances from one pass to the next (event-driven: to the next slice that finishes).

Between passes every rank runs its placed jobs the way a fill executor does: at most ``max_jobs_per_rank`` of them,
the earliest placed (a job assigned early, while one there finishes, waits for it: the executor prepares it and starts
it when the other ends), each bubble class to one job by :func:`pipefill.plan.assign_jobs` (the executor's rule), a
job doing ``samples_per_bubble × count_per_step`` units per training step there; progress is committed continuously. A job's view gains its measured profile when it is
first placed (its executor profiles it) and its slices' commit pointers as they grow; a finished job is Succeeded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from pipefill.plan import BubbleClass, JobProfile, ProfilePoint, assign_jobs
from pipefill.queue import FillJobView, PassResult, RankView, SliceStatus, Snapshot, TrainingJobView, schedule_pass

__all__ = ["Cluster", "SimResult", "lower_bound_s", "rank_units_per_s"]


@dataclass
class SimResult:
    completion_s: dict[str, float]
    passes: int
    results: list[PassResult] = field(default_factory=list)

    @property
    def makespan_s(self) -> float:
        return max(self.completion_s.values())

    @property
    def mean_completion_s(self) -> float:
        return sum(self.completion_s.values()) / len(self.completion_s)


def rank_units_per_s(
    classes: tuple[BubbleClass, ...],
    step_s: float,
    guard_s: float,
    jobs: list[tuple[str, tuple[ProfilePoint, ...], int]],
) -> dict[str, float]:
    """Units per second each of ``jobs`` (name, true profile, priority) does on a rank, as its executor splits the
    classes among them."""
    if not jobs:
        return {}
    profiles = [JobProfile(name, profile, priority) for name, profile, priority in jobs]
    out = dict.fromkeys((name for name, _, _ in jobs), 0.0)
    for a in assign_jobs(classes, profiles, guard_s=guard_s):
        if a.job is not None and a.plan is not None:
            out[a.job] += a.plan.samples_per_bubble * a.bubble.count_per_step / step_s
    return out


def lower_bound_s(
    training_jobs: tuple[TrainingJobView, ...], views: list[FillJobView], true: dict[str, tuple[ProfilePoint, ...]]
) -> float:
    """Total work (dedicated-device seconds at each job's best throughput) ÷ total bubble capacity (bubble seconds
    per second over all ranks): no schedule finishes the queue sooner."""
    work_s = sum(v.total / max(p.items / p.step_s for p in true[v.name]) for v in views)
    capacity = sum(
        sum(c.duration_s * c.count_per_step for c in r.bubble_classes) / (r.step_s or math.inf)
        for t in training_jobs
        for r in t.ranks
    )
    return work_s / capacity


class Cluster:
    """``training_jobs`` with reported classes on every rank; ``views`` the queue; ``true`` each job's real profile."""

    def __init__(
        self,
        training_jobs: tuple[TrainingJobView, ...],
        views: list[FillJobView],
        true: dict[str, tuple[ProfilePoint, ...]],
        *,
        policy: str,
        max_jobs_per_rank: int = 2,
        keep_results: bool = False,
    ) -> None:
        self.training_jobs, self.true, self.policy = training_jobs, true, policy
        self.max_jobs, self.keep_results = max_jobs_per_rank, keep_results
        self.views = {v.name: v for v in views}
        self.progress: dict[str, list[float]] = {}  # per job, per slice: committed units (fractional)
        self.placed_at: dict[tuple[str, int], int] = {}  # (job, slice start) -> the pass that placed it
        self.ranks: dict[str, tuple[TrainingJobView, RankView]] = {
            r.pod_uid: (t, r) for t in training_jobs for r in t.ranks
        }
        self._split: dict[tuple[str, tuple[tuple[str, int], ...]], dict[str, float]] = {}  # rank_units_per_s's

    def run(self, *, max_passes: int = 100_000) -> SimResult:
        t_s, done, passes = 0.0, {}, 0
        results = []
        while len(done) < len(self.views):
            if passes >= max_passes:
                raise RuntimeError(f"{self.policy}: not done after {passes} passes ({len(done)}/{len(self.views)})")
            passes += 1
            result = schedule_pass(
                Snapshot(tuple(self.views.values()), self.training_jobs),
                policy=self.policy,
                max_jobs_per_rank=self.max_jobs,
            )
            if self.keep_results:
                results.append(result)
            self._apply(result)
            rates = self._rates()
            if not rates:
                raise RuntimeError(f"{self.policy}: nothing runs at t={t_s:.1f}s: {result.reasons()}")
            dt = min(self._left(name, i) / r for (name, i), r in rates.items())
            t_s += dt
            for (name, i), r in rates.items():
                p = self.progress[name]
                left = self._left(name, i)
                p[i] = self.views[name].slices[i].end if r * dt >= left - 1e-9 else p[i] + r * dt
            for name in list(self.views):
                if name not in done and self._finished(name):
                    done[name] = t_s
            self._report(done)
        return SimResult(done, passes, results)

    def _apply(self, result: PassResult) -> None:
        for key, o in result.jobs.items():
            v = self.views[key[1]]
            if not v.active:
                continue
            profile = v.profile or (self.true[v.name] if o.assignments else ())  # its executor profiles it
            phase = "Running" if o.assignments else v.phase
            now = (o.slices, o.assignments, o.epoch, profile, phase)
            if now != (v.slices, v.assignments, v.epoch, v.profile, v.phase):  # a new view is validated again
                self.views[v.name] = replace(
                    v, slices=o.slices, assignments=o.assignments, epoch=o.epoch, profile=profile, phase=phase
                )
            self.progress.setdefault(v.name, [float(s.committed) for s in o.slices])
            for p in o.new:
                self.placed_at[v.name, p.start] = len(self.placed_at)

    def _rates(self) -> dict[tuple[str, int], float]:
        """Units per second of every placed slice."""
        on_pod: dict[str, list[tuple[str, int]]] = {}
        for v in self.views.values():
            for a in v.assignments:
                idx = next(i for i, s in enumerate(v.slices) if s.start == a.start)
                on_pod.setdefault(a.pod_uid, []).append((v.name, idx))
        out = {}
        for uid, placed in on_pod.items():
            tj, rank = self.ranks[uid]
            placed = sorted(placed, key=lambda js: self.placed_at[js[0], self.views[js[0]].slices[js[1]].start])
            placed = placed[: self.max_jobs]  # the executor's limit: one assigned early waits for a finishing one
            jobs = [(name, self.true[name], self.views[name].priority) for name, _ in placed]
            step_s = rank.step_s if rank.step_s is not None else math.inf
            key = (uid, tuple((name, priority) for name, _, priority in jobs))  # the true profiles never change
            per_job = self._split.get(key)
            if per_job is None:
                per_job = self._split[key] = rank_units_per_s(rank.bubble_classes, step_s, tj.guard_s, jobs)
            for name, idx in placed:
                if per_job[name] > 0:
                    out[name, idx] = per_job[name]
        return out

    def _left(self, name: str, idx: int) -> float:
        return self.views[name].slices[idx].end - self.progress[name][idx]

    def _finished(self, name: str) -> bool:
        v = self.views[name]
        return bool(v.slices) and all(self._left(name, i) <= 1e-9 for i in range(len(v.slices)))

    def _report(self, done: dict[str, float]) -> None:
        """The executors' reports: commit pointers (whole units), and Succeeded for finished jobs."""
        for name, v in self.views.items():
            if not v.slices or not v.active:
                continue
            slices = tuple(
                SliceStatus(s.start, s.end, min(s.end, math.floor(self.progress[name][i] + 1e-9)))
                for i, s in enumerate(v.slices)
            )
            phase = "Succeeded" if name in done else v.phase
            assignments = () if name in done else v.assignments
            if (slices, phase, assignments) != (v.slices, v.phase, v.assignments):
                self.views[name] = replace(v, slices=slices, phase=phase, assignments=assignments)
