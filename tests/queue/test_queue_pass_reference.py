"""The pass's fast paths against straightforward references (#22): on seeded synthetic clusters of a few hundred
FillJobs, every policy's whole result — placements, epochs, reasons — equals the result with the references swapped in.

- makespan's initial gains: every (kind, rank) scored through :func:`pipefill.queue.makespan._gain`, one rank at a
  time, instead of the loop that takes what is equal per rank capacity out of it;
- a waiting job's count of free ranks that fit it: every free rank of its group checked, instead of counts per
  capacity less the ranks it excludes (counting every rank per waiting job made the pass quadratic).
"""

from __future__ import annotations

import pytest

from pipefill.queue import makespan, reasons
from pipefill.queue.makespan import _gain, _Kind
from pipefill.queue.policies import POLICIES
from pipefill.queue.reasons import Memo
from pipefill.queue.scheduler import PassResult, schedule_pass
from pipefill.queue.snapshot import Snapshot
from pipefill.queue.state import Job, State
from pipefill.queue.synthetic import synthetic_snapshot


def _reference_gains(
    state: State, kinds: dict[int, _Kind], best: dict[int, list[float]]
) -> dict[tuple[int, int], float]:
    """Rank by rank (the order of the gains does not matter: the pass sorts and heaps them)."""
    gains = {}
    for ki, kind in kinds.items():
        for host in kind.job.group.hosts:
            speed = state.rates.speed(kind.job.demand_id, host.cap_id)
            if speed > 0:
                kind.fastest = max(kind.fastest, speed)
                kind.speed[host.order] = speed
                free = host.order in best
                gain = (_gain(state, kind.job.demand_id, host, best[host.order]) if host.work else speed) if free else 0
                if gain > 0:
                    gains[ki, host.order] = gain
    return gains


def _reference_free_fitting(state: State, job: Job, memo: Memo) -> int:
    return sum(
        1
        for h in job.group.hosts
        if h.load < state.max_jobs
        and (h.tj.name, h.rank.rank) not in job.unfit
        and h.rank.pod_uid not in job.pods
        and state.rates.fits(job.demand_id, h.cap_id)
    )


@pytest.fixture(scope="module", params=[(0, 20, 200), (1, 30, 300), (2, 40, 400), (3, 12, 300)])
def snapshot(request: pytest.FixtureRequest) -> Snapshot:
    seed, training_jobs, fill_jobs = request.param
    return synthetic_snapshot(training_jobs=training_jobs, ranks_per_job=8, fill_jobs=fill_jobs, seed=seed)


def _passes(snapshot: Snapshot, policy: str) -> dict[int, PassResult]:
    return {mj: schedule_pass(snapshot, policy=policy, max_jobs_per_rank=mj) for mj in (1, 2, 3)}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_pass_equals_the_pass_with_the_straightforward_references(
    policy: str, snapshot: Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _passes(snapshot, policy)
    with monkeypatch.context() as m:
        m.setattr(makespan, "_initial_gains", _reference_gains)
        m.setattr(reasons, "free_fitting_ranks", _reference_free_fitting)
        slow = _passes(snapshot, policy)
    for mj, result in fast.items():
        assert result.jobs == slow[mj].jobs, f"{policy}, max_jobs_per_rank={mj}: the pass differs from the reference"
    # the comparison saw what it is about: placements made, and jobs that wait beside free ranks that fit them
    assert any(r.new for r in fast.values())
    counted = [o.reason for r in fast.values() for o in r.jobs.values() if "free ranks that fit" in o.reason]
    if policy == "makespan":
        assert counted, "no makespan job waited beside free ranks: the count was not compared"
