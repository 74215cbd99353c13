"""The policies' orders on cases where they differ, and makespan's placement by fit; then the simulated cluster:
makespan finishes a mixed queue sooner than fifo and within a stated factor of the lower bound, sjf lowers the mean
completion time, and every pass of every policy keeps the queue's constraints."""

from __future__ import annotations

import pytest
from queue_cases import GIB, HEAVY, LIGHT, LONG, SHORT, cluster, mixed_queue, training_job
from queue_sim import Cluster, lower_bound_s

from pipefill.plan import ProfilePoint
from pipefill.queue import FillJobView, PassResult, Placement, SliceStatus, Snapshot, schedule_pass

DAY_S = 86_400.0


def _first(policy: str, *jobs: FillJobView) -> str:
    """The job that gets the only slot of a one-rank cluster under ``policy``."""
    result = schedule_pass(Snapshot(jobs, (training_job("t", LONG, 1),)), policy=policy, max_jobs_per_rank=1)
    (name,) = [key[1] for key, o in result.jobs.items() if o.assignments]
    return name


def test_fifo_and_priority_differ() -> None:
    old = FillJobView("old", total=1000, created_unix_s=1.0, priority=0)
    urgent = FillJobView("urgent", total=1000, created_unix_s=2.0, priority=5)
    assert _first("fifo", old, urgent) == "old"
    assert _first("priority", old, urgent) == "urgent"


def test_deadline_orders_equal_priorities_by_deadline() -> None:
    late = FillJobView("late", total=1000, created_unix_s=1.0, deadline_unix_s=3 * DAY_S)
    soon = FillJobView("soon", total=1000, created_unix_s=2.0, deadline_unix_s=1 * DAY_S)
    none = FillJobView("none", total=1000, created_unix_s=0.0)
    assert _first("priority", late, soon, none) == "none"
    assert _first("fifo", late, soon, none) == "none"
    assert _first("deadline", late, soon, none) == "soon"  # a job without a deadline goes after those with one
    assert _first("deadline", late, none) == "late"
    # the FillJob field's documented meaning: earliest deadline first *among equal priorities*
    higher = FillJobView("higher", total=1000, created_unix_s=3.0, priority=1)
    assert _first("deadline", soon, higher) == "higher"


def test_sjf_orders_by_remaining_work() -> None:
    fast = (ProfilePoint(1, 0.001, GIB), ProfilePoint(8, 0.004, GIB))  # 2000 units/s at its best
    big_fast = FillJobView("big-fast", total=100_000, created_unix_s=1.0, profile=fast)  # 50 s
    small_slow = FillJobView(
        "small-slow", total=1000, created_unix_s=2.0, profile=(ProfilePoint(1, 0.01, GIB),)
    )  # 10 s
    estimated = FillJobView("estimated", total=2000, created_unix_s=3.0, estimate_step_s=0.01)  # 20 s by estimate
    unknown = FillJobView("unknown", total=10, created_unix_s=0.0)  # neither: after every job with one
    assert _first("fifo", big_fast, small_slow, estimated, unknown) == "unknown"
    assert _first("sjf", big_fast, small_slow, estimated, unknown) == "small-slow"
    assert _first("sjf", big_fast, estimated, unknown) == "estimated"
    assert _first("sjf", big_fast, unknown) == "big-fast"
    # remaining work, not total: most of the big job is committed already
    nearly = FillJobView(
        "nearly", total=100_000, created_unix_s=1.0, profile=fast, slices=(SliceStatus(0, 100_000, 99_000),)
    )
    assert _first("sjf", nearly, small_slow) == "nearly"


def test_makespan_gives_each_rank_the_jobs_that_fill_it_best() -> None:
    """A large model uses long bubbles well and short ones poorly; a small model is as good in either. Makespan
    sends the large one to the long bubbles (fifo, by creation order, does the opposite here)."""
    small = FillJobView("small", total=200_000, created_unix_s=1.0, profile=LIGHT)
    large = FillJobView("large", total=30_000, created_unix_s=2.0, profile=HEAVY)
    tjs = (training_job("short", SHORT, 1), training_job("long", LONG, 1))
    ranks_of = {}
    for policy in ("fifo", "makespan"):
        result = schedule_pass(Snapshot((small, large), tjs), policy=policy, max_jobs_per_rank=1)
        ranks_of[policy] = {k[1]: o.assignments[0].training_job for k, o in result.jobs.items()}
    assert ranks_of["makespan"] == {"large": "long", "small": "short"}
    assert ranks_of["fifo"] == {"small": "long", "large": "short"}


def test_makespan_waits_for_a_much_faster_rank() -> None:
    """The long-bubble rank is busy with a short job; the large model would run 2× slower on the free short-bubble
    rank than it will there once the short job ends, so it waits instead of becoming the queue's tail."""
    long_tj, short_tj = training_job("long", LONG, 1), training_job("short", SHORT, 1)
    pod = long_tj.ranks[0]
    busy = FillJobView(
        "busy",
        total=800,
        profile=LIGHT,
        phase="Running",
        slices=(SliceStatus(0, 800, 0),),
        assignments=(Placement("busy", 0, 800, "long", 0, pod.pod, pod.pod_uid, 1),),
        epoch=1,
    )
    large = FillJobView("large", total=30_000, created_unix_s=2.0, profile=HEAVY)
    result = schedule_pass(Snapshot((busy, large), (long_tj, short_tj)), policy="makespan", max_jobs_per_rank=1)
    assert not result.jobs["default", "large"].assignments
    assert result.jobs["default", "large"].reason.startswith("waiting for rank long/0: it finishes the job sooner")
    fifo = schedule_pass(Snapshot((busy, large), (long_tj, short_tj)), policy="fifo", max_jobs_per_rank=1)
    assert [p.training_job for p in fifo.jobs["default", "large"].assignments] == ["short"]


SEEDS = (0, 1, 2)
FACTOR = 1.7
"""makespan ≤ FACTOR × (total work ÷ total bubble capacity) on these queues; measured 1.37–1.56 over seeds 0–7.
The bound is not reachable: the best any job does on these ranks is ~80 % of the bubble time (whole steps, memory)."""


def _check_constraints(results: list[PassResult], views: dict[str, FillJobView], max_jobs: int) -> None:
    """Every pass: ≤ max_jobs per pod, ≤ maxParallelRanks pods per job, one placement per slice, epochs grow, and a
    slice that moved left a pod that is gone (all pods stay here, so only done slices or unfit move — none)."""
    last_epoch: dict[str, int] = {}
    holder: dict[tuple[str, int], str] = {}
    for result in results:
        per_pod: dict[str, set[str]] = {}
        for (_, name), o in result.jobs.items():
            pods = [p.pod_uid for p in o.assignments]
            assert len(pods) == len(set(pods)) <= views[name].parallel_ranks
            assert len({p.start for p in o.assignments}) == len(o.assignments)
            for p in o.new:
                assert p.epoch > last_epoch.get(name, 0)
            last_epoch[name] = o.epoch
            for p in o.assignments:
                per_pod.setdefault(p.pod_uid, set()).add(name)
                if (name, p.start) in holder:
                    assert holder[name, p.start] == p.pod_uid, f"{name} slice {p.start} moved off a live pod"
                holder[name, p.start] = p.pod_uid
        assert max((len(v) for v in per_pod.values()), default=0) <= max_jobs


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, int], tuple[float, float, float]]:
    """(policy, seed) -> (makespan ÷ lower bound, mean completion ÷ lower bound, lower bound)."""
    tjs = cluster()
    out = {}
    for seed in SEEDS:
        views, true = mixed_queue(seed)
        lb = lower_bound_s(tjs, views, true)
        for policy in ("fifo", "sjf", "makespan"):
            sim = Cluster(tjs, views, true, policy=policy, keep_results=seed == SEEDS[0])
            r = sim.run()
            if r.results:
                _check_constraints(r.results, {v.name: v for v in views}, 2)
            out[policy, seed] = (r.makespan_s / lb, r.mean_completion_s / lb, lb)
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_makespan_finishes_sooner_than_fifo_near_the_bound(runs: dict, seed: int) -> None:  # type: ignore[type-arg]
    makespan, fifo = runs["makespan", seed][0], runs["fifo", seed][0]
    assert makespan < fifo, (makespan, fifo)
    assert 1.0 <= makespan <= FACTOR, makespan


@pytest.mark.parametrize("seed", SEEDS)
def test_sjf_lowers_the_mean_completion_time(runs: dict, seed: int) -> None:  # type: ignore[type-arg]
    assert runs["sjf", seed][1] < runs["fifo", seed][1]
