"""End to end on the real control plane: the operator as its own process (its fill queue) and every rank pod's fill
executor as a real process (kwok pods run nothing, so each gets its pod's name and uid in its environment, a real
bubble channel fed by the synthetic trainer, and its training job's own fill ServiceAccount).

A FillJob split across two training jobs completes with outputs byte-identical to a single-rank run while one host
job is deleted midway: its slices move (after its pods are gone, at higher epochs) and resume from the committed
sample. One executor of the deleted job is frozen first (a lost node: the process outlives its pod) and thawed after
its slice was taken over: it writes nothing more."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from fill_e2e_helpers import RankExecutor, start_rank
from fill_queue_helpers import Fill, fill_manifest, scheduled, start_queue_operator, status
from operator_harness import GROUP, VERSION, Kube, job_manifest, phase, running
from waiting import wait_for

from pipefill.devcluster import ControlPlane
from pipefill.events import CommitEvent, JobEvent, SliceEvent, read_events
from pipefill.spec import parse
from pipefill_fill.store import read_outputs, read_pointer
from pipefill_fill.task import FillTask, TaskSpec
from pipefill_fill.work import Slice

# Each test's waits are bounded by their own timeouts; its whole (pytest-timeout's 120 s by default) is not: the first
# control-plane test of a worker starts the control plane in its setup (27 s in CI), and beside a busy test the
# split-job call took 93 s (CI, session 31; 23 s alone), together past 120 s.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(300)]

TOTAL = 16384  # 16 slices of 1024 with maxParallelRanks 4: long enough to be caught midway
PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "batchSizes": [1, 4, 16], "commitEverySamples": 64}


@dataclass
class World:
    """The control plane, the test's namespace with the operator serving it, the rank processes started."""

    cp: ControlPlane
    kube: Kube
    namespace: str
    ranks: list[RankExecutor]
    tmp: Path


@pytest.fixture
def world(
    control_plane: ControlPlane, kube: Kube, namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> Iterator[World]:
    operator = start_queue_operator(operator_kubeconfig, tmp_path / "operator.log", namespace)
    started = World(control_plane, kube, namespace, [], tmp_path)
    yield started
    for r in started.ranks:
        r.stop()
    operator.stop()


def _reference(tmp_path: Path, manifest: dict[str, Any]) -> bytes:
    ref = json.loads(json.dumps(manifest))
    ref["spec"]["output"] = {"path": str(tmp_path / "reference")}
    ref["spec"]["maxParallelRanks"] = 1
    task = FillTask(TaskSpec.from_spec(parse(ref)))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    while not task.done():
        task.step(64)
    assert task.finish()
    return (tmp_path / "reference" / "outputs.npy").read_bytes()


def _midway(executor: RankExecutor, storage: Path) -> set[tuple[int, int]]:
    """The slices ``executor`` claimed whose commit pointer in the storage is past their start and short of their
    end. The storage, not the executor's log: its commit writer moves the pointer before the filling thread logs the
    commit, so an executor frozen between the two has, by its log, a slice part done that is already complete."""
    claimed = {
        (e.start, e.end)
        for e in read_events(executor.out / "fill-events.jsonl")
        if isinstance(e, SliceEvent) and e.phase == "claimed"
    }
    pointers = {k: read_pointer(storage / "slices" / Slice(*k).key, start=k[0]) for k in claimed}
    return {(a, b) for (a, b), (p, done) in pointers.items() if a < p < b and not done}


def _committed(obj: dict[str, Any]) -> int:
    return sum(s["committed"] - s["start"] for s in status(obj).get("slices") or ())


def test_a_split_job_survives_a_deleted_host_with_identical_outputs(world: World) -> None:
    control_plane, kube, namespace, ranks, tmp_path = world.cp, world.kube, world.namespace, world.ranks, world.tmp
    hosts = {}
    for job in ("first", "second"):
        kube.create_job(namespace, job_manifest(job))
        hosts[job] = kube.wait_pods(namespace, job, running(2))
        kube.wait_job(namespace, job, phase("Running"))
    manifest = fill_manifest(
        "embed",
        workload={"kind": "inference", "builtin": "encoder-inference", "parameters": PARAMS},
        output={"path": str(tmp_path / "storage" / "embed")},
        totalSamples=TOTAL,
        maxParallelRanks=4,
    )
    manifest["apiVersion"], manifest["kind"] = f"{GROUP}/{VERSION}", "FillJob"
    reference = _reference(tmp_path, manifest)
    fill = Fill(kube, namespace)
    fill.create(manifest)
    placed = status(fill.wait("embed", lambda o: len(status(o).get("assignments") or ()) == 4))
    assert {a["trainingJob"] for a in placed["assignments"]} == {"first", "second"}  # split across both hosts
    by_pod: dict[str, RankExecutor] = {}
    for job, pods in hosts.items():
        for pod in pods:
            by_pod[pod["metadata"]["name"]] = start_rank(control_plane, namespace, pod, job=job, workdir=tmp_path)
            ranks.append(by_pod[pod["metadata"]["name"]])

    first = [by_pod[p["metadata"]["name"]] for p in hosts["first"]]
    frozen, other = first

    # caught by the storage, not the status: the status lags by a report (2 s) and a slice can start and end
    # between two reports, so waiting for the status to show the frozen one mid-slice could wait for good
    storage = tmp_path / "storage" / "embed"
    for _ in range(20):
        wait_for(lambda: _midway(frozen, storage), "the frozen executor part way through a slice", timeout_s=60)
        frozen.freeze_between_commits()  # a lost node: the process outlives its pod and hears nothing
        midway = _midway(frozen, storage)  # still part way once frozen (it may have finished that slice meanwhile)
        if midway:
            break
        frozen.signal(signal.SIGCONT)
    assert midway, "the frozen executor was never caught mid-slice"
    assignments = status(fill.get("embed"))["assignments"]
    held = {
        (a["start"], a["end"]): a for a in assignments if a["podUID"] == frozen.uid and (a["start"], a["end"]) in midway
    }
    assert held, (midway, assignments)
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "pipelinetrainingjobs", "first")
    other.signal(signal.SIGTERM)  # the kubelet's stop: it commits what it has and exits

    second_uids = {p["metadata"]["uid"] for p in hosts["second"]}
    new_epochs: dict[tuple[int, int], int] = {}  # the epoch each frozen slice was first placed on the second job at

    def moved(obj: dict[str, Any]) -> bool:  # the frozen one cannot finish its slices: they must move to be done
        for a in status(obj).get("assignments") or ():
            if (a["start"], a["end"]) in held and a["podUID"] in second_uids:
                new_epochs.setdefault((a["start"], a["end"]), a["epoch"])
        return set(new_epochs) == set(held)

    fill.wait("embed", moved, timeout_s=180)
    takeover: dict[tuple[int, int], int] = {}  # where the new owner of each frozen slice resumed

    def taken_over() -> bool:
        for r in ranks[2:]:
            for e in read_events(r.out / "fill-events.jsonl"):
                if isinstance(e, SliceEvent) and e.phase in ("claimed", "done") and (e.start, e.end) in held:
                    takeover.setdefault((e.start, e.end), e.position)
        return set(takeover) == set(held)

    fill.wait("embed", lambda o: taken_over() or _committed(o) == TOTAL, timeout_s=180)
    frozen.signal(signal.SIGCONT)  # thawed: it must write nothing more
    # the verdict is the executor's, samplesDone the queue's sum of the pointers (STATUS_WRITERS): a pass after it
    done = fill.wait(
        "embed",
        lambda o: status(o).get("phase") == "Succeeded" and status(o).get("samplesDone") == TOTAL,
        timeout_s=300,
    )
    stale_log = frozen.stop()

    st = status(done)
    assert [s["committed"] for s in st["slices"]] == [s["end"] for s in st["slices"]] and st["samplesDone"] == TOTAL
    out = tmp_path / "storage" / "embed"
    assert (out / "outputs.npy").read_bytes() == reference  # zero samples lost or repeated, bytes identical
    assert read_outputs(out)["sample_id"].tolist() == list(range(TOTAL))
    epochs = [(k, held[k]["epoch"], new_epochs[k]) for k in held]
    assert all(new > old for _, old, new in epochs), epochs
    assert any(pos > start for (start, _), pos in takeover.items()), "no slice resumed mid-way from its commit"
    commits = [e for e in read_events(frozen.out / "fill-events.jsonl") if isinstance(e, CommitEvent)]
    for e in commits:
        key = (e.slice[0], e.slice[1]) if e.slice else None
        if key in takeover:
            assert (e.position or 0) <= takeover[key], f"the frozen executor committed {e} past the takeover"
    assert "stale executor refused at commit" in stale_log or "letting go of slice" in stale_log, stale_log[-2000:]


def test_an_unfit_report_from_a_real_executor_moves_the_job(world: World) -> None:
    """The executor of a rank whose bubbles (3 ms) are shorter than the job's shortest step (a heavier encoder, tens
    of ms here) profiles it, reports ``unfit`` with the numbers and lets go; the operator moves the job to the other
    rank at a higher epoch, whose executor (long bubbles) completes it."""
    kube, namespace, tmp_path = world.kube, world.namespace, world.tmp
    kube.create_job(namespace, job_manifest("host"))
    pods = {p["metadata"]["uid"]: p for p in kube.wait_pods(namespace, "host", running(2))}
    kube.wait_job(namespace, "host", phase("Running"))
    # Its longest piece (one layer of one sample: about 10 ms on a 2-vCPU CI machine) must stay longer than a 3 ms
    # bubble less the guard on a machine several times faster: at hiddenSize 256 (3.5 ms) a faster VM fitted it.
    heavy = {"layers": 4, "hiddenSize": 512, "heads": 4, "seqLen": 128, "batchSizes": [1, 2]}
    manifest = fill_manifest(
        "heavy",
        workload={"kind": "inference", "builtin": "encoder-inference", "parameters": heavy},
        output={"path": str(tmp_path / "storage" / "heavy")},
        totalSamples=64,
    )
    fill = Fill(kube, namespace)
    fill.create(manifest)
    (placed,) = status(fill.wait("heavy", lambda o: len(status(o).get("assignments") or ()) == 1))["assignments"]
    tight = start_rank(world.cp, namespace, pods[placed["podUID"]], job="host", workdir=tmp_path, bubbles_ms="3")
    world.ranks.append(tight)
    moved = fill.wait(
        "heavy",
        lambda o: (
            bool(status(o).get("unfit"))
            and [a["rank"] for a in status(o).get("assignments") or ()] == [1 - placed["rank"]]
        ),
        timeout_s=240,
    )
    (unfit,) = status(moved)["unfit"]
    assert (unfit["trainingJob"], unfit["rank"], unfit["reason"]) == ("host", placed["rank"], "BubbleTooShort")
    assert unfit["stepMilliseconds"] > unfit["longestBubbleMilliseconds"] and unfit["freeBytes"] > 0
    assert "no bubble long enough" in unfit["message"]
    assert status(moved)["profile"][0]["batchSize"] == 1  # the measured profile, for the policies
    (now,) = status(moved)["assignments"]
    assert now["epoch"] > placed["epoch"]
    roomy = start_rank(world.cp, namespace, pods[now["podUID"]], job="host", workdir=tmp_path, bubbles_ms="250")
    world.ranks.append(roomy)
    fill.wait("heavy", lambda o: status(o).get("phase") == "Succeeded", timeout_s=300)
    assert read_outputs(tmp_path / "storage" / "heavy")["sample_id"].tolist() == list(range(64))


def _settled_stop(ranks: dict[str, RankExecutor], job: str) -> tuple[int, int] | None:
    """(when, pointer) of the last stop of ``job`` over every executor of the host (let go at a bubble, or refused
    at a commit) when no commit of it follows that stop anywhere; None while one does, or before any stop. Every
    executor, not the first placement's: the queue may have moved the job to the other rank (an executor lets it
    go then, and the other one goes on committing), so the first stop seen is not necessarily the one asked for."""
    stops, last_commit = [], -1
    for rank in ranks.values():
        for e in read_events(rank.out / "fill-events.jsonl"):
            if isinstance(e, JobEvent) and e.job == job and e.phase == "Released":
                stops.append((e.mono_ns, e.committed or 0))
            elif isinstance(e, SliceEvent) and e.job == job and e.phase == "superseded":
                stops.append((e.mono_ns, e.position))
            elif isinstance(e, CommitEvent) and e.job == job:
                last_commit = max(last_commit, e.mono_ns)
    if not stops or max(stops)[0] < last_commit:
        return None
    return max(stops)


def _running_long_job(world: World, name: str) -> tuple[Fill, dict[str, RankExecutor]]:
    """A long FillJob on a 2-rank host, both executors started; once it has committed something: the FillJob and
    every executor by pod uid."""
    kube, namespace, tmp_path = world.kube, world.namespace, world.tmp
    kube.create_job(namespace, job_manifest("host"))
    pods = {p["metadata"]["uid"]: p for p in kube.wait_pods(namespace, "host", running(2))}
    kube.wait_job(namespace, "host", phase("Running"))
    manifest = fill_manifest(
        name,
        workload={"kind": "inference", "builtin": "encoder-inference", "parameters": PARAMS},
        output={"path": str(tmp_path / "storage" / name)},
        totalSamples=10**6,
    )
    fill = Fill(kube, namespace)
    fill.create(manifest)
    fill.wait(name, lambda o: len(status(o).get("assignments") or ()) == 1)
    by_uid = {uid: start_rank(world.cp, namespace, pod, job="host", workdir=tmp_path) for uid, pod in pods.items()}
    world.ranks.extend(by_uid.values())
    fill.wait(name, lambda o: _committed(o) > 0, timeout_s=180)
    return fill, by_uid


def test_a_cancelled_job_stops_at_the_next_bubble_and_commits_nothing_more(world: World) -> None:
    """``spec.cancel`` mid-run: the operator revokes the assignment and ends the job Cancelled; the executor lets go
    at its next bubble (or its commit due there is refused) and the job's storage keeps exactly what was committed
    before."""
    fill, ranks = _running_long_job(world, "long")
    fill.patch_spec("long", {"cancel": True})
    fill.wait("long", lambda o: status(o).get("phase") == "Cancelled", timeout_s=60)
    progress = world.tmp / "storage" / "long" / "progress.json"
    # the executors' event logs, not the FillJob: Cancelled is its last change, so no watch event would come
    stopped = wait_for(lambda: _settled_stop(ranks, "long"), "the executors' stop of the cancelled job", timeout_s=60)
    pointer = json.loads(progress.read_text())["committed"]
    assert stopped[1] == pointer  # what was committed when it stopped is what the storage keeps
    for rank in ranks.values():
        rank.stop()
    after = _settled_stop(ranks, "long")  # nothing committed after it, by either executor
    assert after is not None and after[1] == pointer
    assert json.loads(progress.read_text())["committed"] == pointer


def test_a_suspended_job_stops_keeps_its_progress_and_resumes_there(world: World) -> None:
    """``spec.suspend`` mid-run: the operator removes the assignment, the executor stops without committing and the
    pointer stays; unsuspended, the slice is placed again at a higher epoch and resumes from that pointer."""
    fill, by_uid = _running_long_job(world, "paused")
    epoch = status(fill.get("paused"))["epoch"]
    fill.patch_spec("paused", {"suspend": True})
    fill.wait("paused", lambda o: not status(o).get("assignments"), timeout_s=60)
    progress = world.tmp / "storage" / "paused" / "progress.json"
    when, committed = wait_for(lambda: _settled_stop(by_uid, "paused"), "the executors' stop", timeout_s=60)
    assert json.loads(progress.read_text())["committed"] == committed
    fill.patch_spec("paused", {"suspend": False})
    again = fill.wait("paused", lambda o: len(status(o).get("assignments") or ()) == 1, timeout_s=60)
    (placed,) = status(again)["assignments"]
    assert placed["epoch"] > epoch
    now = by_uid[placed["podUID"]].out / "fill-events.jsonl"  # either rank may host it now

    def resumed() -> list[SliceEvent]:
        return [e for e in read_events(now) if isinstance(e, SliceEvent) and e.phase == "claimed" and e.mono_ns > when]

    claimed = wait_for(resumed, "the slice claimed again", timeout_s=60)
    assert claimed[0].position == committed  # resumed exactly from the committed sample


def test_a_job_committed_but_not_completed_is_completed_by_the_executor_the_operator_keeps_placed(
    world: World,
) -> None:
    """Every sample committed, the outputs not assembled: the executors that held the slices died between their last
    commit and the completion. That is not Succeeded: the operator keeps one placement (Completing), the executor
    started for that pod assembles ``outputs.npy``, byte-identical to a single-rank run, and only its report makes
    the job Succeeded."""
    kube, namespace, tmp_path = world.kube, world.namespace, world.tmp
    kube.create_job(namespace, job_manifest("host"))
    pods = {p["metadata"]["uid"]: p for p in kube.wait_pods(namespace, "host", running(2))}
    kube.wait_job(namespace, "host", phase("Running"))
    out = tmp_path / "storage" / "late"
    manifest = fill_manifest(
        "late",
        workload={"kind": "inference", "builtin": "encoder-inference", "parameters": PARAMS},
        output={"path": str(out)},
        totalSamples=1024,
        maxParallelRanks=2,
    )
    manifest["apiVersion"], manifest["kind"] = f"{GROUP}/{VERSION}", "FillJob"
    reference = _reference(tmp_path, manifest)
    fill = Fill(kube, namespace)
    fill.create(manifest)
    slices = status(fill.wait("late", lambda o: len(status(o).get("assignments") or ()) == 2))["slices"]
    plan = [Slice(s["start"], s["end"]) for s in slices]
    spec = TaskSpec.from_spec(parse(manifest), plan=plan)  # type: ignore[arg-type]
    for s in plan:  # what the dead executors left: every slice committed and marked done, nothing assembled
        task = FillTask(spec, s)
        task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
        while not task.done():
            task.step(64)
        task.commit()
        task.store.mark_done()
    for s in slices:  # and their last reports
        fill.commit("late", s["start"], s["end"])
    completing = fill.wait("late", lambda o: scheduled(o).get("reason") == "Completing")
    assert status(completing)["phase"] == "Running" and status(completing)["samplesDone"] == 1024
    assert not (out / "outputs.npy").exists()
    (placed,) = status(completing)["assignments"]
    world.ranks.append(start_rank(world.cp, namespace, pods[placed["podUID"]], job="host", workdir=tmp_path))
    done = fill.wait("late", lambda o: scheduled(o).get("reason") == "Completed", timeout_s=120)
    assert status(done)["phase"] == "Succeeded" and status(done)["assignments"] == []
    assert (out / "outputs.npy").read_bytes() == reference
