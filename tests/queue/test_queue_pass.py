"""One scheduling pass: every constraint it promises, the reasons it gives, epochs, determinism, bad input."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from queue_cases import GIB, HEAVY, LIGHT, LONG, SHORT, ranks, training_job

from pipefill.plan import BubbleClass, ProfilePoint
from pipefill.queue import (
    FillJobView,
    Placement,
    SliceStatus,
    Snapshot,
    TrainingJobView,
    Unfit,
    plan_slices,
    schedule_pass,
)
from pipefill.spec import parse
from pipefill.spec.common import LabelSelector, LabelSelectorRequirement, SelectorOperator


def _job(name: str, **kw: object) -> FillJobView:
    kw.setdefault("total", 10_000)
    return FillJobView(name, **kw)  # type: ignore[arg-type]


def _placed(result: object, name: str, namespace: str = "default") -> list[Placement]:
    return list(result.jobs[namespace, name].assignments)  # type: ignore[attr-defined]


def test_max_parallel_ranks_and_one_slice_per_pod() -> None:
    snap = Snapshot((_job("split", max_parallel_ranks=3),), (training_job("t", LONG, 8),))
    placed = _placed(schedule_pass(snap), "split")
    assert len(placed) == 3
    assert len({p.pod_uid for p in placed}) == 3
    plan = plan_slices(10_000, parallel_ranks=3)
    assert [(p.start, p.end) for p in placed] == [(s.start, s.end) for s in plan[:3]]  # the plan's first slices


def test_training_jobs_use_one_rank() -> None:
    snap = Snapshot((_job("train", kind="training", max_parallel_ranks=4),), (training_job("t", LONG, 8),))
    result = schedule_pass(snap)
    assert len(_placed(result, "train")) == 1
    assert [(s.start, s.end) for s in result.jobs["default", "train"].slices] == [(0, 10_000)]


@pytest.mark.parametrize("policy", ["fifo", "priority", "sjf", "deadline", "makespan"])
@pytest.mark.parametrize("max_jobs", [1, 2, 3])
def test_at_most_n_jobs_per_rank(policy: str, max_jobs: int) -> None:
    classes = (BubbleClass(0.2, 12 * GIB), BubbleClass(0.1, 12 * GIB), BubbleClass(0.05, 12 * GIB))
    jobs = tuple(_job(f"j{i}", created_unix_s=i, profile=(ProfilePoint(1, 0.01 * (i + 1), GIB),)) for i in range(6))
    snap = Snapshot(jobs, (training_job("t", classes, 2),))
    result = schedule_pass(snap, policy=policy, max_jobs_per_rank=max_jobs)
    per_pod: dict[str, int] = {}
    for o in result.jobs.values():
        for p in o.assignments:
            per_pod[p.pod_uid] = per_pod.get(p.pod_uid, 0) + 1
    assert max(per_pod.values()) <= max_jobs
    waiting = result.reasons()
    if policy != "makespan":  # the others fill every slot
        assert sum(per_pod.values()) == 2 * max_jobs
        assert all("waiting for a free rank" in r for r in waiting.values()), waiting


def test_kept_placements_count_against_the_rank() -> None:
    t = training_job("t", LONG, 1)
    pod = t.ranks[0]
    s = plan_slices(10_000, parallel_ranks=1)[0]
    running = [
        _job(
            f"run{i}",
            slices=(SliceStatus(s.start, s.end, 100),),
            assignments=(Placement(f"run{i}", s.start, s.end, "t", 0, pod.pod, pod.pod_uid, 1),),
            epoch=1,
            phase="Running",
        )
        for i in range(2)
    ]
    result = schedule_pass(Snapshot((*running, _job("new")), (t,)), max_jobs_per_rank=2)
    assert not _placed(result, "new")
    assert "waiting for a free rank" in result.jobs["default", "new"].reason
    for i in range(2):  # kept as they were: same epoch, nothing new
        o = result.jobs["default", f"run{i}"]
        assert o.assignments == running[i].assignments and not o.new and o.epoch == 1


def _running_on(t: TrainingJobView, rank: int, *, committed: int, epoch: int = 3) -> FillJobView:
    s = plan_slices(10_000, parallel_ranks=1)[0]
    pod = t.ranks[rank]
    return _job(
        "moving",
        slices=(SliceStatus(s.start, s.end, committed),),
        assignments=(Placement("moving", s.start, s.end, t.name, rank, pod.pod, pod.pod_uid, epoch),),
        epoch=epoch,
        phase="Running",
    )


def test_slices_move_only_after_the_old_pod_terminated() -> None:
    old, new = training_job("old", LONG, 1), training_job("new", LONG, 1)
    job = _running_on(old, 0, committed=4_000)
    stopped = replace(old, running=False)
    # the host stopped but its pod still exists (terminating): the slice stays where it is
    draining = schedule_pass(Snapshot((job,), (stopped, new)))
    o = draining.jobs["default", "moving"]
    assert o.assignments == job.assignments and not o.new and not o.released
    assert "wait for their pods to terminate" in o.reason
    # the pod is gone: the slice moves, with a new epoch, resuming from its commit pointer
    gone = replace(stopped, ranks=())
    moved = schedule_pass(Snapshot((job,), (gone, new)))
    o = moved.jobs["default", "moving"]
    assert o.released == job.assignments
    (p,) = o.new
    assert (p.training_job, p.rank, p.epoch) == ("new", 0, 4) and o.epoch == 4
    assert o.slices[0].committed == 4_000 and not o.reason


def test_live_pods_outside_the_ranks_hold_their_slices() -> None:
    """A restarted gang: the old pod (another uid) still terminates while the new one is running."""
    t = training_job("t", LONG, 1)
    job = _running_on(t, 0, committed=10)
    restarted = replace(t, ranks=(replace(t.ranks[0], pod_uid="uid-new-generation"),))
    o = schedule_pass(Snapshot((job,), (restarted,), live_pod_uids=frozenset({t.ranks[0].pod_uid}))).jobs[
        "default", "moving"
    ]
    assert o.assignments == job.assignments and "terminate" in o.reason
    o = schedule_pass(Snapshot((job,), (restarted,))).jobs["default", "moving"]
    assert [p.pod_uid for p in o.assignments] == ["uid-new-generation"] and o.assignments[0].epoch == 4


def test_unfit_reports_steer_away_and_release() -> None:
    t = training_job("t", LONG, 2)
    job = replace(_running_on(t, 0, committed=0), unfit=(Unfit("t", 0, "no bubble long enough: 12 ms < 40 ms"),))
    o = schedule_pass(Snapshot((job,), (t,))).jobs["default", "moving"]
    assert o.released == job.assignments  # its executor let go when it reported
    assert [(p.rank, p.epoch) for p in o.new] == [(1, 4)]
    everywhere = replace(job, unfit=(Unfit("t", 0, "too short"), Unfit("t", 1, "not enough memory")), assignments=())
    o = schedule_pass(Snapshot((everywhere,), (t,))).jobs["default", "moving"]
    assert not o.assignments
    assert o.reason.startswith("every eligible rank reported this job unfit") and "t/1: not enough memory" in o.reason


def test_done_slices_are_released_and_final_jobs_hold_nothing() -> None:
    t = training_job("t", LONG, 2)
    plan = plan_slices(10_000, parallel_ranks=2)
    pod = t.ranks[0]
    first_done = _job(
        "split",
        max_parallel_ranks=2,
        slices=tuple(SliceStatus(s.start, s.end, s.end if i == 0 else s.start) for i, s in enumerate(plan)),
        assignments=(Placement("split", plan[0].start, plan[0].end, "t", 0, pod.pod, pod.pod_uid, 3),),
        epoch=3,
        phase="Running",
    )
    o = schedule_pass(Snapshot((first_done,), (t,))).jobs["default", "split"]
    assert o.released == first_done.assignments and (plan[0].start, plan[0].end) not in {
        (p.start, p.end) for p in o.assignments
    }
    final = replace(_running_on(t, 0, committed=500), phase="Cancelled")
    o = schedule_pass(Snapshot((final,), (t,))).jobs["default", "moving"]
    assert not o.assignments and not o.new and o.released == final.assignments


def test_a_job_with_every_slice_committed_stays_placed_until_an_executor_completes_it() -> None:
    """Committed is not complete: an executor assembles the outputs and calls finalize, then reports Succeeded. The
    placement that committed last stays for that; when its pod is gone (the executor died before completing), the
    last slice is placed again, with a new epoch, so another executor completes the job."""
    t = training_job("t", LONG, 2)
    done = _running_on(t, 0, committed=10_000)
    o = schedule_pass(Snapshot((done,), (t,))).jobs["default", "moving"]
    assert o.assignments == done.assignments and not o.released and not o.new and not o.reason
    replaced = replace(t, ranks=(replace(t.ranks[0], pod_uid="uid-t-0-new"), t.ranks[1]))  # the old pod is gone
    out = schedule_pass(Snapshot((done,), (replaced,))).jobs["default", "moving"]
    assert out.released == done.assignments
    (placed,) = out.new
    assert (placed.start, placed.end, placed.epoch) == (0, 10_000, 4) and placed.pod_uid != "uid-t-0"


def test_started_slices_resume_first() -> None:
    plan = plan_slices(10_000, parallel_ranks=2)
    slices = tuple(SliceStatus(s.start, s.end, s.start + (7 if i == 5 else 0)) for i, s in enumerate(plan))
    job = _job("j", max_parallel_ranks=2, slices=slices)
    placed = sorted(_placed(schedule_pass(Snapshot((job,), (training_job("t", LONG, 4),))), "j"), key=lambda p: p.epoch)
    assert [(p.start, p.end, p.epoch) for p in placed] == [
        (plan[5].start, plan[5].end, 1),
        (plan[0].start, plan[0].end, 2),
    ]


SELECTIVE = LabelSelector(match_expressions=[LabelSelectorRequirement("tier", SelectorOperator.IN, ["batch"])])


@pytest.mark.parametrize(
    ("job", "tjs", "reason"),
    [
        (_job("j"), (), "no PipelineTrainingJob is Running in namespace default"),
        (
            _job("j", namespace="other"),
            (training_job("t", LONG, 1),),
            "no PipelineTrainingJob is Running in namespace other",
        ),
        (
            _job("j", host_selector=LabelSelector(match_labels={"team": "vision"})),
            (training_job("t", LONG, 1, labels={"team": "speech"}),),
            "hostSelector {team=vision} matches no running training job (1 running in namespace default: t)",
        ),
        (_job("j"), (training_job("t", LONG, 1, fill_enabled=False),), "fill is disabled (spec.fill.enabled: false)"),
        (
            _job("j", labels={"tier": "interactive"}),
            (training_job("t", LONG, 1, fill_job_selector=SELECTIVE),),
            "the fill-job selector of every matching training job refuses this job's labels {tier=interactive} "
            "(t admits {tier In (batch)})",
        ),
        (
            _job("j", profile=HEAVY),
            (training_job("t", (BubbleClass(0.1, 2 * GIB),), 1),),
            "no bubble class of the 1 eligible ranks fits the job (t/0: memory: the smallest batch (1) needs 3GiB",
        ),
        (
            _job("j", estimate_step_s=0.5, estimate_peak_bytes=GIB),
            (training_job("t", LONG, 1),),
            "no bubble class of the 1 eligible ranks fits the job (t/0: time: the fastest step",
        ),
        (_job("j"), (training_job("t", LONG, 1, running=False),), "no PipelineTrainingJob is Running"),
        (
            _job("j", storage_claim="team-fill"),
            (training_job("t", LONG, 1, fill_storage_claim="other"),),
            "no matching training job's fill storage holds this job: its output is on claim team-fill "
            "(t's spec.fill.storage: claim other)",
        ),
        (
            _job("j"),
            (training_job("t", LONG, 1, fill_storage_claim="team-fill"),),
            "no matching training job's fill storage holds this job: its output is on no claim",
        ),
    ],
)
def test_reasons_when_nothing_can_be_assigned(job: FillJobView, tjs: tuple[TrainingJobView, ...], reason: str) -> None:
    for policy in ("fifo", "makespan"):
        o = schedule_pass(Snapshot((job,), tjs), policy=policy).jobs[job.key]
        assert not o.assignments
        assert o.reason.startswith(reason), o.reason
        assert o.code == ("NoFittingBubble" if "bubble class" in reason else "NoMatchingHost")


def test_a_job_runs_only_where_the_fill_storage_holds_it() -> None:
    tjs = (
        training_job("plain", LONG, 1),
        training_job("shared", LONG, 1, fill_storage_claim="team-fill"),
    )
    result = schedule_pass(Snapshot((_job("on-claim", storage_claim="team-fill"), _job("local")), tjs))
    assert [p.training_job for p in result.jobs["default", "on-claim"].assignments] == ["shared"]
    assert [p.training_job for p in result.jobs["default", "local"].assignments] == ["plain"]


def test_selectors_admit_when_they_match() -> None:
    tjs = (
        training_job("speech", LONG, 1, labels={"team": "speech"}),
        training_job("vision", LONG, 1, labels={"team": "vision"}, fill_job_selector=SELECTIVE),
    )
    job = _job("j", labels={"tier": "batch"}, host_selector=LabelSelector(match_labels={"team": "vision"}))
    assert [p.training_job for p in _placed(schedule_pass(Snapshot((job,), tjs)), "j")] == ["vision"]


def _manifest(schedule: str = "1f1b") -> dict[str, object]:
    pipeline = {"stages": 4, "microbatches": 8, "globalBatch": 32, "schedule": schedule}
    if schedule == "custom":
        pipeline["customSchedule"] = {"name": "sched"}
    return {
        "apiVersion": "pipefill.io/v1alpha1",
        "kind": "PipelineTrainingJob",
        "metadata": {"name": "predicted", "labels": {"team": "x"}},
        "spec": {
            "model": {"preset": "gpt-1.3b", "seqLen": 2048},
            "pipeline": pipeline,
            "fill": {"reservedMemory": "8Gi"},
        },
    }


def test_ranks_without_reports_use_the_simulators_prediction() -> None:
    job = parse(_manifest())
    view = TrainingJobView.from_spec(
        job, ranks=tuple(replace(r, bubble_classes=(), step_s=None) for r in ranks("predicted", LONG, 4))
    )  # type: ignore[arg-type]
    # a short-step job fits the predicted bubbles of every rank; one that needs 1 s steps fits none
    quick = _job("quick", max_parallel_ranks=4, profile=LIGHT)
    slow = _job("slow", profile=(ProfilePoint(1, 1.0, GIB),))
    result = schedule_pass(Snapshot((quick, slow), (view,)))
    assert len(_placed(result, "quick")) == 4
    assert result.jobs["default", "slow"].reason.startswith("no bubble class of the 4 eligible ranks fits the job")


def test_ranks_whose_bubbles_are_unknown_host_jobs_until_they_report() -> None:
    """A custom schedule without its CSV cannot be predicted: its ranks still host jobs (learning by placing; an
    unfit report would steer a job away), makespan one per rank and preferring ranks whose bubbles are known."""
    job = parse(_manifest("custom"))
    unknown = TrainingJobView.from_spec(
        job,  # type: ignore[arg-type]
        ranks=tuple(replace(r, bubble_classes=(), step_s=None) for r in ranks("predicted", LONG, 2)),
    )
    jobs = tuple(_job(f"j{i}", created_unix_s=float(i), profile=LIGHT) for i in range(3))
    for policy in ("fifo", "makespan"):
        result = schedule_pass(Snapshot(jobs, (unknown,)), policy=policy)
        placed = [p for o in result.jobs.values() for p in o.assignments]
        assert len(placed) == (3 if policy == "fifo" else 2), placed  # makespan: one job per unknown rank
    known = training_job("known", LONG, 1)
    result = schedule_pass(Snapshot(jobs[:1], (unknown, known)), policy="makespan")
    assert [p.training_job for p in result.jobs["default", "j0"].assignments] == ["known"]


def test_a_pass_depends_only_on_the_snapshot() -> None:
    rng = random.Random(3)
    tjs = [training_job(f"t{i}", (LONG, SHORT)[i % 2], 3) for i in range(4)]
    jobs = [
        _job(
            f"j{i}",
            created_unix_s=rng.choice((1.0, 2.0)),
            priority=rng.choice((0, 1)),
            profile=rng.choice((HEAVY, LIGHT)),
            max_parallel_ranks=rng.choice((1, 2)),
        )
        for i in range(20)
    ]
    for policy in ("fifo", "priority", "sjf", "deadline", "makespan"):
        first = schedule_pass(Snapshot(tuple(jobs), tuple(tjs)), policy=policy)
        for _ in range(3):
            rng.shuffle(jobs)
            rng.shuffle(tjs)
            again = schedule_pass(Snapshot(tuple(jobs), tuple(tjs)), policy=policy)
            assert again.jobs == first.jobs


def test_bad_input_names_the_field() -> None:
    snap = Snapshot((_job("j"),), (training_job("t", LONG, 1),))
    with pytest.raises(ValueError, match="policy: 'lifo' is not one of fifo, priority, sjf, deadline, makespan"):
        schedule_pass(snap, policy="lifo")
    with pytest.raises(ValueError, match="max_jobs_per_rank: 0 must be ≥ 1"):
        schedule_pass(snap, max_jobs_per_rank=0)
    with pytest.raises(ValueError, match=r"status.slices: the plan covers \[0, 50\) but the job has 100 units"):
        _job("j", total=100, slices=(SliceStatus(0, 50, 0),))
    with pytest.raises(ValueError, match="leave a gap or overlap"):
        _job("j", total=100, slices=(SliceStatus(0, 50, 0), SliceStatus(40, 100, 40)))
    with pytest.raises(ValueError, match="committed 60 must lie within the slice"):
        SliceStatus(0, 50, 60)
    with pytest.raises(ValueError, match="FillJob default/j appears more than once"):
        Snapshot((_job("j"), _job("j")), ())
    with pytest.raises(ValueError, match="no bubble classes and step time reported and no spec"):
        TrainingJobView("t", ranks=(replace(ranks("t", LONG, 1)[0], bubble_classes=()),))
    with pytest.raises(ValueError, match="assignment epoch 2 exceeds the job's epoch 1"):
        _job(
            "j",
            total=100,
            slices=(SliceStatus(0, 100, 0),),
            epoch=1,
            assignments=(Placement("j", 0, 100, "t", 0, "p", "u", 2),),
        )


def test_views_from_the_example_manifests_place_the_demo_job() -> None:
    """The demo's FillJob and training job, as the operator will build their views from the typed specs."""
    from pipefill.spec import load_file

    (fill,) = load_file("examples/fill-inference.yaml")
    (train,) = load_file("examples/cpu-demo.yaml")
    est = {"estimates": {"stepMilliseconds": 4.0, "memory": "256Mi"}}
    raw = {"apiVersion": "pipefill.io/v1alpha1", "kind": "FillJob", "metadata": {"name": "x", "labels": {"a": "b"}}}
    shared = {**_spec_of(fill), "output": {"path": "embed-corpus", "claimName": "fills"}}
    with_estimates = parse({**raw, "spec": {**shared, **est}})
    view = FillJobView.from_spec(with_estimates, namespace="ns", created_unix_s=5.0)  # type: ignore[arg-type]
    assert (view.total, view.max_parallel_ranks, view.priority, view.labels) == (16384, 2, 10, {"a": "b"})
    assert (view.estimate_step_s, view.estimate_peak_bytes) == (0.004, 256 << 20)
    demo = FillJobView.from_spec(fill)  # type: ignore[arg-type]
    host = TrainingJobView.from_spec(train, ranks=ranks("cpu-demo", (), 2))  # type: ignore[arg-type]
    assert host.labels == {"pipefill.io/fill-pool": "demo"} and host.guard_s == 0.0005
    # a relative path and no claim: its outputs land in the pod that runs it, so one rank (two pods would each hold
    # part of them); on a claim, or at an absolute path (a volume the user mounts in every pod), it is split
    assert (demo.max_parallel_ranks, demo.storage_claim) == (1, None)
    absolute = {**_spec_of(fill), "output": {"path": "/shared/embed-corpus"}}
    assert FillJobView.from_spec(parse({**raw, "spec": absolute})).max_parallel_ranks == 2  # type: ignore[arg-type]
    result = schedule_pass(Snapshot((demo,), (host,)))
    assert [(p.training_job, p.rank) for p in result.jobs["default", "embed-corpus"].assignments] == [("cpu-demo", 0)]
    split = FillJobView.from_spec(parse({**raw, "metadata": {"name": "embed-corpus"}, "spec": shared}))  # type: ignore[arg-type]
    host = replace(host, fill_storage_claim="fills")
    result = schedule_pass(Snapshot((split,), (host,)))
    assert [(p.training_job, p.rank) for p in result.jobs["default", "embed-corpus"].assignments] == [
        ("cpu-demo", 0),
        ("cpu-demo", 1),
    ]


def _spec_of(job: object) -> dict[str, object]:
    from pipefill.spec import to_obj

    spec: dict[str, object] = to_obj(job)["spec"]  # type: ignore[index]
    return spec


@pytest.mark.parametrize(("committed", "next_placed"), [(9_990, True), (100, False)])
def test_a_finishing_job_frees_its_slot_early_once_per_rank(committed: int, next_placed: bool) -> None:
    """#30 item 5: a kept slice whose rest takes under FINISHING_LEAD_S at the job's speed there lets the next job onto
    the rank now, so its executor has it ready when the slice ends; one such extra slot a rank, never more."""
    t = training_job("t", LONG, 1)
    pod = t.ranks[0]
    s = plan_slices(10_000, parallel_ranks=1)[0]
    fast = (ProfilePoint(1, 0.001, GIB),)  # 1 000 units a dedicated second: 10 units left are a few ms of bubbles
    running = [
        _job(
            f"run{i}",
            slices=(SliceStatus(s.start, s.end, committed),),
            assignments=(Placement(f"run{i}", s.start, s.end, "t", 0, pod.pod, pod.pod_uid, 1),),
            epoch=1,
            phase="Running",
            profile=fast,
            created_unix_s=i,
        )
        for i in range(2)  # both finishing (or neither): still one early slot
    ]
    new = [_job(f"new{i}", profile=fast, created_unix_s=10 + i) for i in range(2)]
    result = schedule_pass(Snapshot((*running, *new), (t,)), max_jobs_per_rank=2)
    assert bool(_placed(result, "new0")) is next_placed
    assert not _placed(result, "new1")  # one early slot per rank, however many finish
    assert all(result.jobs["default", f"run{i}"].assignments == running[i].assignments for i in range(2))
