"""Which queued fill job goes to which bubble class.

Rules, in order:

1. Priority first: the highest-priority jobs take every class they can use; lower priorities get the rest.
2. Among jobs of equal priority, each class goes to the job that turns it into the most *normalized work*: the
   dedicated-device seconds that job would need for the samples it does in one bubble (samples ÷ its best
   throughput), per second of bubble. This makes jobs of different speeds comparable.
3. Fairness within a priority level: a job that can use some class but got none takes, from a job holding several, the
   class whose move loses the least normalized work. So with a training job (long steps) and a small inference job
   (short steps), the long bubbles go to training and the short ones to inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipefill.plan.planner import BubbleClass, ClassPlan, ProfilePoint, plan_class

__all__ = ["Assignment", "JobProfile", "assign_jobs"]


@dataclass(frozen=True)
class JobProfile:
    """A queued fill job as the planner sees it: its profile and priority (queue order breaks ties)."""

    name: str
    profile: tuple[ProfilePoint, ...]
    priority: int = 0
    kind: str = "inference"
    transfer_s: float = 0.0  # offload mode: state in + out per bubble

    @property
    def best_throughput(self) -> float:
        """Samples per second at the fastest batch size, memory ignored: the job on a dedicated device."""
        return max((p.items / p.step_s for p in self.profile), default=0.0)


@dataclass(frozen=True)
class Assignment:
    """One bubble class and the job (with its plan) that runs in it; ``job`` is None when no job can use it."""

    bubble: BubbleClass
    job: str | None
    plan: ClassPlan | None
    candidates: dict[str, ClassPlan] = field(default_factory=dict)


def assign_jobs(
    classes: Sequence[BubbleClass],
    jobs: Sequence[JobProfile],
    *,
    guard_s: float,
    switch_s: float = 0.0,
    margin_bytes: int = 0,
    min_bubble_s: float = 0.0,
) -> list[Assignment]:
    """One :class:`Assignment` per class, in the order of ``classes``."""
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"jobs: names must be unique, got {names}")
    plans: dict[tuple[int, str], ClassPlan] = {}
    for ci, c in enumerate(classes):
        for j in jobs:
            plans[ci, j.name] = plan_class(
                c,
                j.profile,
                guard_s=guard_s,
                switch_s=switch_s,
                transfer_s=j.transfer_s,
                margin_bytes=margin_bytes,
                min_bubble_s=min_bubble_s,
            )
    owner: dict[int, str] = {}
    for level in sorted({j.priority for j in jobs}, reverse=True):
        members = [j for j in jobs if j.priority == level]
        free = [ci for ci in range(len(classes)) if ci not in owner]
        owner.update(_assign_level(classes, members, free, plans))
    out = []
    for ci, c in enumerate(classes):
        name = owner.get(ci)
        cands = {j.name: plans[ci, j.name] for j in jobs}
        out.append(Assignment(c, name, plans[ci, name] if name is not None else None, cands))
    return out


def _assign_level(
    classes: Sequence[BubbleClass],
    members: Sequence[JobProfile],
    free: Sequence[int],
    plans: dict[tuple[int, str], ClassPlan],
) -> dict[int, str]:
    def work(ci: int, job: JobProfile) -> float:
        plan = plans[ci, job.name]
        if not plan.usable or job.best_throughput <= 0 or classes[ci].duration_s <= 0:
            return -1.0
        return plan.samples_per_bubble / job.best_throughput / classes[ci].duration_s

    owner: dict[int, str] = {}
    for ci in free:
        best = max(members, key=lambda j: work(ci, j))  # max keeps the first of equals: queue order
        if work(ci, best) >= 0:
            owner[ci] = best.name
    by_name = {j.name: j for j in members}
    changed = True
    while changed:
        changed = False
        held = {j.name: [ci for ci, n in owner.items() if n == j.name] for j in members}
        for starving in members:
            if held[starving.name]:
                continue
            moves = [
                (work(ci, by_name[owner[ci]]) - work(ci, starving), ci)
                for ci in owner
                if work(ci, starving) >= 0 and len(held[owner[ci]]) > 1
            ]
            if moves:
                _, ci = min(moves)
                owner[ci] = starving.name
                changed = True
                break
    return owner
