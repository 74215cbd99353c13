"""The FillJob queue on the real control plane, the operator as its own process (kwok GPU nodes; the test plays the
kubelet and the fill executors by patching pod and FillJob status).

Slices are planned once and handed out with epochs; a selector matching nothing stays Queued with the reason; a
host that stops keeps its slices until its pod is gone from the API, then they move with a higher epoch and resume
from the commit pointer; unfit reports, suspend and resume, cancel; the policy flag reaches the pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fill_queue_helpers import (
    FILL_PLURAL,
    Fill,
    Recorder,
    assigned,
    fill_manifest,
    scheduled,
    start_queue_operator,
    status,
)
from kubernetes.client.rest import ApiException
from operator_harness import GROUP, VERSION, Kube, OperatorProcess, custom_pipeline, job_manifest, phase, running

from pipefill.queue import plan_slices

pytestmark = pytest.mark.cluster


@pytest.fixture
def operators(operator_kubeconfig: Path, namespace: str, tmp_path: Path) -> Iterator[Callable[..., OperatorProcess]]:
    started: list[OperatorProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> OperatorProcess:
        proc = start_queue_operator(
            operator_kubeconfig, tmp_path / f"op-{len(started)}.log", namespace, args=args, env=env
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def _host(kube: Kube, namespace: str, name: str, **spec: Any) -> list[dict[str, Any]]:
    """A Running 2-rank training job; its pods."""
    kube.create_job(namespace, job_manifest(name, **spec))
    pods = kube.wait_pods(namespace, name, running(2))
    kube.wait_job(namespace, name, phase("Running"))
    return pods


def _uids(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def test_slices_planned_once_assigned_with_epochs_and_done_from_the_commit_pointers(
    kube: Kube, namespace: str, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators()
    uids = _uids(_host(kube, namespace, "host"))
    fill = Fill(kube, namespace)
    fill.create(fill_manifest("embed", maxParallelRanks=2, minSliceSamples=128))
    obj = fill.wait("embed", assigned(2))
    st = status(obj)
    bounds = plan_slices(1024, parallel_ranks=2, min_units=128)
    plan = [{"start": s.start, "end": s.end, "committed": s.start} for s in bounds]
    assert st["slices"] == plan and len(plan) == 8
    assert st["output"] == {"path": "/data/out", "files": ["outputs.npy"]}
    first = st["assignments"]
    assert [(a["start"], a["end"]) for a in first] == [(0, 128), (128, 256)]  # started and fresh work in order
    assert {a["pod"]: a["podUID"] for a in first} == uids  # one slice on each rank pod, by pod uid
    assert sorted(a["epoch"] for a in first) == [1, 2] and st["epoch"] == 2
    assert st["phase"] == "Running" and scheduled(obj)["status"] == "True" and scheduled(obj)["reason"] == "Assigned"

    # executors commit the first two slices: the next two go out with new epochs, the plan stays as written
    for a in first:
        fill.commit("embed", a["start"], a["end"])
    obj = fill.wait("embed", lambda o: {a["start"] for a in status(o).get("assignments") or ()} == {256, 384})
    st = status(obj)
    assert [(s["start"], s["end"]) for s in st["slices"]] == [(s["start"], s["end"]) for s in plan]
    assert sorted(a["epoch"] for a in st["assignments"]) == [3, 4] and st["epoch"] == 4
    assert st["samplesDone"] == 256

    # every slice committed: one placement stays, for the executor that completes the job (outputs, finalize)
    for s in plan:
        fill.commit("embed", s["start"], s["end"])
    obj = fill.wait("embed", lambda o: scheduled(o).get("reason") == "Completing")
    st = status(obj)
    assert st["phase"] == "Running" and st["samplesDone"] == 1024 and len(st["assignments"]) == 1

    # its executor reports Succeeded: nothing assigned any more
    fill.executor_patch("embed", lambda s: s.update(phase="Succeeded"))
    obj = fill.wait("embed", lambda o: scheduled(o).get("reason") == "Completed")
    assert status(obj)["assignments"] == [] and status(obj)["phase"] == "Succeeded"
    assert operator.metric("pipefill_operator_fill_jobs", {"phase": "Succeeded"}) == 1.0


def test_a_selector_matching_nothing_stays_queued_with_the_reason(
    kube: Kube, namespace: str, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators()
    _host(
        kube,
        namespace,
        "host",
        fill={"cpu": "100m", "memory": "256Mi", "jobSelector": {"matchLabels": {"tier": "batch"}}},
    )
    fill = Fill(kube, namespace)
    batch = {"tier": "batch"}
    fill.create(fill_manifest("picky", labels=batch, hostSelector={"matchLabels": {"team": "vision"}}))
    obj = fill.wait("picky", lambda o: scheduled(o).get("reason") == "NoMatchingHost")
    assert status(obj)["phase"] == "Queued" and status(obj)["assignments"] == []
    assert scheduled(obj)["status"] == "False"
    assert "hostSelector {team=vision} matches no running training job" in scheduled(obj)["message"]
    # a training job whose storage does not hold the job is no host either, and says so
    fill.create(fill_manifest("stored", labels=batch, output={"path": "out", "claimName": "team-fill"}))
    obj = fill.wait("stored", lambda o: scheduled(o).get("reason") == "NoMatchingHost")
    assert "fill storage holds this job" in status(obj)["message"]
    # the training job's spec.fill.jobSelector refuses what it does not admit
    fill.create(fill_manifest("interactive", labels={"tier": "interactive"}))
    obj = fill.wait("interactive", lambda o: scheduled(o).get("reason") == "NoMatchingHost")
    assert "refuses this job's labels {tier=interactive} (host admits {tier=batch})" in status(obj)["message"]
    fill.create(fill_manifest("admitted", labels=batch))
    fill.wait("admitted", assigned(1))
    assert operator.metric("pipefill_operator_fill_queue_length") == 3.0


def test_a_failed_host_keeps_its_slice_until_the_pod_is_gone_then_it_moves_with_a_higher_epoch(
    kube: Kube, namespace: str, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators()
    _host(kube, namespace, "first")
    fill = Fill(kube, namespace)
    fill.create(fill_manifest("embed"))  # one slice: maxParallelRanks 1
    (placed,) = status(fill.wait("embed", assigned(1)))["assignments"]
    assert placed["trainingJob"] == "first" and placed["epoch"] == 1
    fill.commit("embed", 0, 300)
    second = _uids(_host(kube, namespace, "second"))

    # the host's trainer fails for good: the job is Failed, the failed pod stays (its executor may still run)
    kube.end_trainer(namespace, placed["pod"], 1, "bad data")
    kube.wait_job(namespace, "first", phase("Failed"))
    obj = fill.wait("embed", lambda o: scheduled(o).get("reason") == "WaitingForPodTermination")
    assert status(obj)["assignments"] == [placed]  # not moved while the pod exists

    kube.core.delete_namespaced_pod(placed["pod"], namespace)
    obj = fill.wait("embed", lambda o: [a["trainingJob"] for a in status(o).get("assignments") or ()] == ["second"])
    (moved,) = status(obj)["assignments"]
    assert moved["podUID"] in second.values() and moved["epoch"] == 2 and status(obj)["epoch"] == 2
    assert status(obj)["slices"] == [{"start": 0, "end": 1024, "committed": 300}]  # resumes at the commit pointer
    assert operator.metric("pipefill_operator_fill_reassignments_total", {"reason": "pod_gone"}) == 1.0


def test_a_restarted_gang_hosts_again_on_its_new_pods_with_a_higher_epoch(
    kube: Kube, namespace: str, operators: Callable[..., OperatorProcess]
) -> None:
    operators()
    old = _uids(_host(kube, namespace, "host"))
    fill = Fill(kube, namespace)
    fill.create(fill_manifest("embed"))
    (placed,) = status(fill.wait("embed", assigned(1)))["assignments"]
    fill.commit("embed", 0, 100)
    kube.end_trainer(namespace, placed["pod"], 75, "peer gone")  # retryable: the whole gang restarts
    new = _uids(kube.wait_pods(namespace, "host", running(2, generation=1)))
    obj = fill.wait(
        "embed", lambda o: [a["podUID"] for a in status(o).get("assignments") or ()] not in ([], [placed["podUID"]])
    )
    (moved,) = status(obj)["assignments"]
    # the same pod names, new uids: the slice is on a pod of generation 1, never on the old uid again
    assert moved["podUID"] in new.values() and moved["podUID"] not in old.values()
    assert moved["epoch"] == 2 and status(obj)["slices"][0]["committed"] == 100


def test_a_deleted_host_moves_its_slices_once_its_pods_are_gone(
    kube: Kube, namespace: str, operators: Callable[..., OperatorProcess]
) -> None:
    operators()
    first = _host(kube, namespace, "first")
    fill = Fill(kube, namespace)
    fill.create(fill_manifest("embed", maxParallelRanks=2))
    fill.wait("embed", assigned(2))
    before = fill.commit("embed", 0, 64)
    _host(kube, namespace, "second")
    pods = Recorder(kube.core.list_namespaced_pod, namespace, label_selector="pipefill.io/job-name=first")
    fills = Recorder(kube.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, FILL_PLURAL)
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "pipelinetrainingjobs", "first")
    obj = fill.wait("embed", lambda o: {a["trainingJob"] for a in status(o).get("assignments") or ()} == {"second"})
    st = status(obj)
    # epochs 3 and 4, or more: a slice may first go to the other pod of "first" if the pass sees one pod gone
    # before the training job's deletion, and then move again once that pod is gone too
    assert all(a["epoch"] > 2 for a in st["assignments"]) and st["epoch"] >= 4
    assert {a["podUID"] for a in st["assignments"]}.isdisjoint(p["metadata"]["uid"] for p in first)
    assert st["slices"][0]["committed"] == 64  # resumes at the commit pointer

    # the order the API server recorded: no slice left a pod of "first" before that pod was gone
    pods.wait(lambda events: sum(kind == "DELETED" for kind, _, _ in events) == len(first))
    fills.wait(lambda events: any(rv >= int(obj["metadata"]["resourceVersion"]) for _, rv, _ in events))
    gone_rv = {o["metadata"]["uid"]: rv for kind, rv, o in pods.stop() if kind == "DELETED"}
    history = [(rv, status(o).get("assignments") or []) for kind, rv, o in fills.stop() if kind == "MODIFIED"]
    assert set(gone_rv) == {p["metadata"]["uid"] for p in first}
    held = {a["podUID"] for a in status(before)["assignments"]}
    assert held == set(gone_rv)  # both pods of "first" held a slice when it was deleted
    for rv, assignments in history:
        on = {a["podUID"] for a in assignments}
        for uid in sorted(held - on):  # the first version without the pod's slice
            assert rv > gone_rv[uid], f"a slice left pod {uid} at {rv}, before the pod was gone at {gone_rv[uid]}"
            held.discard(uid)
    assert not held  # every slice did leave


def test_an_unfit_report_moves_the_job_to_another_rank(
    kube: Kube, namespace: str, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators()
    _host(kube, namespace, "host")
    fill = Fill(kube, namespace)
    fill.create(fill_manifest("big"))
    (placed,) = status(fill.wait("big", assigned(1)))["assignments"]

    def unfit(st: dict[str, Any]) -> None:
        st["unfit"] = [
            {"trainingJob": "host", "rank": placed["rank"], "reason": "NotEnoughMemory", "message": "needs 9GiB, 2GiB free",
             "freeBytes": 2 << 30, "peakMemoryBytes": 9 << 30},
        ]  # fmt: skip

    fill.executor_patch("big", unfit)
    obj = fill.wait("big", lambda o: [a["rank"] for a in status(o).get("assignments") or ()] == [1 - placed["rank"]])
    assert status(obj)["assignments"][0]["epoch"] == 2
    assert status(obj)["unfit"][0]["rank"] == placed["rank"]  # kept while that rank hosts: it steers the next passes
    assert operator.metric("pipefill_operator_fill_reassignments_total", {"reason": "unfit"}) == 1.0


def test_suspend_releases_and_keeps_progress_resume_places_again(
    kube: Kube, namespace: str, operators: Callable[..., OperatorProcess]
) -> None:
    operators()
    _host(kube, namespace, "host")
    fill = Fill(kube, namespace)
    fill.create(fill_manifest("embed"))
    fill.wait("embed", assigned(1))
    fill.commit("embed", 0, 500)
    fill.patch_spec("embed", {"suspend": True})
    obj = fill.wait("embed", lambda o: scheduled(o).get("reason") == "Suspended")
    st = status(obj)
    assert st["assignments"] == [] and st["phase"] == "Queued" and st["slices"][0]["committed"] == 500
    fill.patch_spec("embed", {"suspend": False})
    obj = fill.wait("embed", assigned(1))
    assert status(obj)["assignments"][0]["epoch"] == 2 and status(obj)["slices"][0]["committed"] == 500
    assert status(obj)["phase"] == "Running"


def test_cancel_ends_cancelled_and_cannot_be_undone(
    kube: Kube, namespace: str, operators: Callable[..., OperatorProcess]
) -> None:
    operators()
    _host(kube, namespace, "host")
    fill = Fill(kube, namespace)
    fill.create(fill_manifest("running"))
    fill.create(fill_manifest("waiting", hostSelector={"matchLabels": {"team": "none"}}))
    fill.wait("running", assigned(1))
    fill.wait("waiting", lambda o: scheduled(o).get("reason") == "NoMatchingHost")
    for name in ("running", "waiting"):
        fill.patch_spec(name, {"cancel": True})
        obj = fill.wait(name, phase("Cancelled"))
        assert status(obj)["assignments"] == [] and scheduled(obj)["reason"] == "Cancelled"
    with pytest.raises(ApiException) as refused:
        fill.patch_spec("running", {"cancel": False})
    assert refused.value.status == 422 and "cannot be set back to false" in str(refused.value.body)


def test_the_policy_flag_reaches_the_pass(
    kube: Kube, namespace: str, operators: Callable[..., OperatorProcess]
) -> None:
    """Two free slots (2 ranks, one job each) and three queued jobs: priority places the newest, high-priority one,
    which fifo (creation order) would leave waiting."""
    operator = operators("--policy", "priority", env={"PIPEFILL_FILL_MAX_ACTIVE_JOBS": "1"})
    fill = Fill(kube, namespace)
    for name, prio in (("old-a", 0), ("old-b", 0), ("urgent", 10)):
        fill.create(fill_manifest(name, priority=prio))
    fill.wait("urgent", lambda o: scheduled(o).get("reason") == "NoMatchingHost")
    _host(kube, namespace, "host")
    fill.wait("urgent", assigned(1))
    fill.wait("old-a", assigned(1))
    obj = fill.wait("old-b", lambda o: bool(scheduled(o).get("reason") in ("NoFreeRank", "QueuedByPolicy")))
    assert status(obj)["phase"] == "Queued"
    count = operator.metric("pipefill_operator_schedule_pass_seconds_count", {"policy": "priority"})
    assert count is not None and count > 0
    assert operator.metric("pipefill_operator_schedule_pass_seconds_count", {"policy": "fifo"}) == 0.0


def test_a_custom_schedules_ranks_are_predicted_from_its_configmap(
    kube: Kube, namespace: str, operators: Callable[..., OperatorProcess]
) -> None:
    """Before its executors report bubbles, a rank is planned with the simulator's prediction; for schedule custom
    from the CSV in the user's ConfigMap, which the job's reconcile reads. A FillJob whose estimated step (10 s)
    outlasts every predicted bubble then waits NoFittingBubble (without a prediction it would be placed, to learn)."""
    operators()
    csv = "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"
    kube.core.create_namespaced_config_map(namespace, {"metadata": {"name": "sched"}, "data": {"schedule.csv": csv}})
    pipeline = custom_pipeline("sched")
    big = {"layers": 24, "hiddenSize": 2048, "heads": 16, "seqLen": 2048, "vocabSize": 50304}  # bubbles ≥ the floor
    _host(kube, namespace, "host", model=big, pipeline=pipeline)
    fill = Fill(kube, namespace)
    fill.create(fill_manifest("slow", estimates={"stepMilliseconds": 10_000}))
    obj = fill.wait("slow", lambda o: scheduled(o).get("reason") == "NoFittingBubble")
    assert status(obj)["phase"] == "Queued" and not status(obj).get("assignments")
