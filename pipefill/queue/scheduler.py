"""One scheduling pass: a snapshot of the cluster in, every FillJob's placements and reasons out.

The operator runs it as one loop (debounced on FillJob, training-job and pod events, plus a period) and writes each
:class:`JobOutcome` into the FillJob's status: the plan of record when it was fixed now, the assignments with their
epochs, the job's epoch, and a condition with the reason when the job waits. Guarantees of every pass:

* a slice has at most one placement, on a pod that exists; it moves only after its old pod has terminated, or after
  that rank reported the job unfit (its executor let go), and then to a new epoch;
* a job holds pods on at most ``maxParallelRanks`` ranks (1 for training), one slice per pod;
* a pod hosts at most ``max_jobs_per_rank`` jobs (``PIPEFILL_FILL_MAX_ACTIVE_JOBS``), counting those it keeps, and
  one more while a slice it keeps is expected done within ``FINISHING_LEAD_S`` (30 s): the next job is assigned
  early and its executor prepares it while the last one finishes (:mod:`pipefill.queue.state`);
* a slice is placed only on a rank of a Running training job in the job's namespace, with fill enabled, that the
  job's hostSelector matches and whose fill-job selector admits the job, that did not report it unfit, and with a
  bubble class that fits a batch of the job (when its profile or estimate is known);
* placements that stay are never moved by a pass (no preemption): policies decide only what goes to free slots;
* the result depends only on the snapshot (ties broken by creation time, names and rank numbers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipefill.env import DEFAULT_FILL_MAX_ACTIVE_JOBS
from pipefill.queue.fit import Rates
from pipefill.queue.makespan import place_makespan
from pipefill.queue.policies import POLICIES, Policy, place_in_order
from pipefill.queue.reasons import Memo, why_waiting
from pipefill.queue.snapshot import Placement, SliceStatus, Snapshot
from pipefill.queue.state import Job, State

__all__ = ["JobOutcome", "PassResult", "schedule_pass"]


@dataclass(frozen=True)
class JobOutcome:
    """A FillJob after the pass. ``assignments``: all its placements now (kept and new, by slice start); ``new``:
    those made in this pass; ``released``: the snapshot's placements dropped (pod terminated, slice done, unfit);
    ``slices``: the plan of record with the commit pointers the pass saw; ``planned``: the plan was fixed in this
    pass (write it into the status); ``reason``: why it runs nowhere, or ""."""

    namespace: str
    name: str
    slices: tuple[SliceStatus, ...]
    planned: bool
    assignments: tuple[Placement, ...]
    new: tuple[Placement, ...]
    released: tuple[Placement, ...]
    epoch: int
    reason: str
    code: str = ""
    """the reason's CamelCase code (pipefill.queue.reasons.CODES), "" when the job does not wait"""


@dataclass(frozen=True)
class PassResult:
    """Every active FillJob's outcome, by (namespace, name); final-phase jobs are listed with no assignments."""

    policy: str
    jobs: Mapping[tuple[str, str], JobOutcome]

    @property
    def new(self) -> list[Placement]:
        """The placements made in this pass, by job then slice."""
        return [p for key in sorted(self.jobs) for p in self.jobs[key].new]

    def reasons(self) -> dict[tuple[str, str], str]:
        """The jobs that wait, and why."""
        return {key: o.reason for key, o in sorted(self.jobs.items()) if o.reason}


def schedule_pass(
    snapshot: Snapshot, *, policy: str = "fifo", max_jobs_per_rank: int = DEFAULT_FILL_MAX_ACTIVE_JOBS
) -> PassResult:
    """Place the queued slices of ``snapshot``'s FillJobs on rank pods by ``policy`` (one of :data:`POLICIES`)."""
    if policy not in POLICIES:
        raise ValueError(f"policy: {policy!r} is not one of {', '.join(POLICIES)}; pick one of them")
    state = State(snapshot, max_jobs=max_jobs_per_rank, rates=Rates())
    chosen = Policy(policy)
    if chosen is Policy.MAKESPAN:
        place_makespan(state)
    else:
        place_in_order(state, chosen)
    memo = Memo()
    out: dict[tuple[str, str], JobOutcome] = {}
    for job in state.jobs:
        out[job.view.key] = _outcome(state, job, policy, memo)
    for view in state.inactive:
        out[view.key] = JobOutcome(
            view.namespace, view.name, view.slices, False, (), (), tuple(view.assignments), view.epoch, ""
        )
    return PassResult(policy, out)


def _outcome(state: State, job: Job, policy: str, memo: Memo) -> JobOutcome:
    running = job.new or [p for p in job.kept if p.pod_uid in state.by_uid]
    code, reason = ("", "") if running or not (job.open or job.kept) else why_waiting(state, job, policy, memo)
    v = job.view
    return JobOutcome(
        v.namespace,
        v.name,
        job.slices,
        job.planned_now,
        tuple(sorted(job.kept + job.new, key=lambda p: (p.start, p.epoch))),
        tuple(job.new),
        tuple(job.released),
        job.epoch,
        reason,
        code,
    )
