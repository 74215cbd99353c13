"""The policies' orders on cases where they differ, and makespan's placement by fit; then the simulated cluster:
makespan finishes a mixed queue sooner than fifo and within a stated factor of the lower bound, sjf lowers the mean
completion time, and every pass of every policy keeps the queue's constraints."""

from __future__ import annotations

import pytest
from queue_cases import GIB, HEAVY, LIGHT, LONG, SHORT, cluster, mixed_queue, training_job
from queue_sim import Cluster, lower_bound_s

from pipefill.plan import ProfilePoint
from pipefill.queue import FillJobView, PassResult, Placement, SliceStatus, Snapshot, TrainingJobView, schedule_pass
from pipefill.queue.fit import Demand, RankCapacity, Rates
from pipefill.queue.state import FINISHING_LEAD_S

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
    rank than it will there once the short job ends, so it waits instead of becoming the queue's tail. (The short job
    has minutes left there: one about to end would let the next one onto the rank now, see test_queue_pass.)"""
    long_tj, short_tj = training_job("long", LONG, 1), training_job("short", SHORT, 1)
    pod = long_tj.ranks[0]
    busy = FillJobView(
        "busy",
        total=24_000,
        profile=LIGHT,
        phase="Running",
        slices=(SliceStatus(0, 24_000, 0),),
        assignments=(Placement("busy", 0, 24_000, "long", 0, pod.pod, pod.pod_uid, 1),),
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


def _finishing(name: str, s: SliceStatus, profile: tuple[ProfilePoint, ...], pod: RankCapacity) -> bool:
    """The queue's rule for an early slot, computed here from the job's true profile (the simulated executor reports
    it at once) and the pod's reported bubbles: the slice's units left take at most FINISHING_LEAD_S there alone."""
    rates = Rates()
    demand = Demand(profile)
    left_s = demand.dedicated_s(s.remaining)
    speed = rates.speed(rates.demand_id(demand), rates.cap_id(pod))
    return left_s is not None and speed > 0 and left_s / speed <= FINISHING_LEAD_S


def _check_constraints(
    results: list[PassResult],
    views: dict[str, FillJobView],
    max_jobs: int,
    training_jobs: tuple[TrainingJobView, ...],
    true: dict[str, tuple[ProfilePoint, ...]],
) -> int:
    """Every pass: ≤ max_jobs per pod, and one more only while a slice the pod kept from the pass before is expected
    done within FINISHING_LEAD_S (#30 item 5: the next job is assigned early; once per pod however many finish);
    ≤ maxParallelRanks pods per job, one placement per slice, epochs grow, and a slice that moved left a pod that is
    gone (all pods stay here, so only done slices or unfit move — none). Returns the passes × pods that used the early
    slot."""
    caps = {
        r.pod_uid: RankCapacity(r.bubble_classes, r.step_s or 1.0, t.guard_s) for t in training_jobs for r in t.ranks
    }
    last_epoch: dict[str, int] = {}
    holder: dict[tuple[str, int], str] = {}
    early = 0
    for result in results:
        per_pod: dict[str, set[str]] = {}
        finishing: dict[str, int] = {}  # pod -> its kept slices expected done within the lead
        for (_, name), o in result.jobs.items():
            pods = [p.pod_uid for p in o.assignments]
            assert len(pods) == len(set(pods)) <= views[name].parallel_ranks
            assert len({p.start for p in o.assignments}) == len(o.assignments)
            for p in o.new:
                assert p.epoch > last_epoch.get(name, 0)
            last_epoch[name] = o.epoch
            by_start = {s.start: s for s in o.slices}
            for p in o.assignments:
                per_pod.setdefault(p.pod_uid, set()).add(name)
                if p not in o.new and _finishing(name, by_start[p.start], true[name], caps[p.pod_uid]):
                    finishing[p.pod_uid] = finishing.get(p.pod_uid, 0) + 1
                if (name, p.start) in holder:
                    assert holder[name, p.start] == p.pod_uid, f"{name} slice {p.start} moved off a live pod"
                holder[name, p.start] = p.pod_uid
        for pod, names in per_pod.items():
            allowed = max_jobs + min(1, finishing.get(pod, 0))
            assert len(names) <= allowed, f"pod {pod}: {sorted(names)} ({finishing.get(pod, 0)} finishing)"
            early += len(names) > max_jobs
    return early


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
            early = _check_constraints(r.results, {v.name: v for v in views}, 2, tjs, true) if r.results else 0
            out[policy, seed] = (r.makespan_s / lb, r.mean_completion_s / lb, lb, early)
    return out


@pytest.mark.parametrize("policy", ["fifo", "sjf"])
def test_full_ranks_take_the_next_job_early(runs: dict, policy: str) -> None:  # type: ignore[type-arg]
    """The checks above are not vacuous: where the queue fills every rank, the early slot of a finishing job is used
    (makespan on this cluster leaves no rank full: it waits for the fastest one instead)."""
    assert runs[policy, SEEDS[0]][3] > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_makespan_finishes_sooner_than_fifo_near_the_bound(runs: dict, seed: int) -> None:  # type: ignore[type-arg]
    makespan, fifo = runs["makespan", seed][0], runs["fifo", seed][0]
    assert makespan < fifo, (makespan, fifo)
    assert 1.0 <= makespan <= FACTOR, makespan


@pytest.mark.parametrize("seed", SEEDS)
def test_sjf_lowers_the_mean_completion_time(runs: dict, seed: int) -> None:  # type: ignore[type-arg]
    assert runs["sjf", seed][1] < runs["fifo", seed][1]
