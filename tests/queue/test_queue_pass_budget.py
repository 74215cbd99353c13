"""The scheduling pass at 10 000 FillJobs stays within its CPU budget (#22, "bad input, tried in bulk").

The cluster is the benchmark's synthetic one (:func:`pipefill.queue.synthetic.synthetic_snapshot`) scaled tenfold:
1 000 training jobs × 8 ranks and 10 000 FillJobs, a third running. Time is this process's CPU time
(``time.process_time``), the best of a few passes (the first fills the simulator's cache), so other work on a busy machine inflates it little. Two limits:

- an absolute one, several times what a pass takes on the loaded 2-core development VM (about 1 s, 2026-11-26), so
  it holds there and still catches a pass that became several times slower;
- a growth one: the same cluster at a tenth of the size (100 × 8 ranks, 1 000 FillJobs) is timed too, and ten times
  the input may cost at most 45 times the CPU (measured 18–23×; a pass quadratic in the FillJobs would take ~100×).

``makespan`` has limits of its own: it scores every kind of job (profile × eligibility group, a few hundred here) on
every rank of its group, so its pass is kinds × ranks, several times a simple policy's. Before the waiting jobs' count
of free ranks was taken per rank capacity (reasons.py), its pass was quadratic in the waiting jobs (39–40× its pass at a
tenth the size), which the growth limit of 30× catches. On the idle development VM of 2026-11-28 (simple policies
1.5–1.6 s, 13×) its pass took 9.1–9.4 s, and a CI run beside other tests 10.09 s; scoring each demand once for all its
groups' ranks (makespan.py, ``_demand_gains``) and the planner's inner loop on plain tuples (plan/bulk.py) brought it
to 5.3 s (12× its pass at a tenth the size).
"""

from __future__ import annotations

import time

import pytest

from pipefill.queue.scheduler import PassResult, schedule_pass
from pipefill.queue.snapshot import Snapshot
from pipefill.queue.synthetic import synthetic_snapshot

_POLICIES = ("fifo", "priority", "sjf", "deadline", "makespan")
_BUDGET_CPU_S = {"makespan": 10.0}  # one pass over 10 000 FillJobs; measured 1.6 s (makespan 5.3 s) on the idle VM
_DEFAULT_BUDGET_CPU_S = 5.0
_MAX_GROWTH = {"makespan": 30.0}  # CPU at 10× the input over CPU at 1×; measured ~13 (makespan 12), quadratic: ~100
_DEFAULT_MAX_GROWTH = 45.0


@pytest.fixture(scope="module")
def large() -> Snapshot:
    return synthetic_snapshot(training_jobs=1000, ranks_per_job=8, fill_jobs=10_000, seed=0)


@pytest.fixture(scope="module")
def small() -> Snapshot:
    return synthetic_snapshot(training_jobs=100, ranks_per_job=8, fill_jobs=1000, seed=0)


def _best_cpu(snapshot: Snapshot, policy: str, passes: int) -> tuple[float, PassResult]:
    best, result = float("inf"), None
    for _ in range(passes):
        c0 = time.process_time()
        result = schedule_pass(snapshot, policy=policy)
        best = min(best, time.process_time() - c0)
    assert result is not None
    return best, result


@pytest.mark.parametrize("policy", _POLICIES)
def test_a_pass_over_ten_thousand_fill_jobs_stays_within_its_cpu_budget(
    policy: str, large: Snapshot, small: Snapshot
) -> None:
    assert len(large.fill_jobs) == 10_000
    small_s, _ = _best_cpu(small, policy, passes=3)  # first: the simulator's predictions are cached after it
    big_s, result = _best_cpu(large, policy, passes=2)
    # the pass did its work: placements made, and every FillJob left waiting says why
    assert len(result.new) > 1000, len(result.new)
    finished = {(j.namespace, j.name) for j in large.fill_jobs if not j.active}
    waiting = [key for key, o in result.jobs.items() if not o.assignments and not o.reason and key not in finished]
    assert not waiting, waiting[:5]
    budget_s = _BUDGET_CPU_S.get(policy, _DEFAULT_BUDGET_CPU_S)
    assert big_s <= budget_s, f"{policy}: one pass over 10 000 FillJobs took {big_s:.2f} s of CPU > {budget_s}"
    growth, max_growth = big_s / max(small_s, 1e-3), _MAX_GROWTH.get(policy, _DEFAULT_MAX_GROWTH)
    assert growth <= max_growth, (
        f"{policy}: 10× the FillJobs and ranks cost {growth:.0f}× the CPU ({small_s * 1e3:.0f} ms → {big_s * 1e3:.0f} ms);"
        f" at most {max_growth:.0f}× — the pass has become worse than linear in its input"
    )
