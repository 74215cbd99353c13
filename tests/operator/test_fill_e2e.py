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
from pathlib import Path
from typing import Any

import pytest
import torch
from fill_e2e_helpers import RankExecutor, start_rank
from fill_queue_helpers import Fill, fill_manifest, start_queue_operator, status
from operator_harness import GROUP, VERSION, Kube, OperatorProcess, job_manifest, phase, running

from pipefill.devcluster import ControlPlane
from pipefill.events import CommitEvent, SliceEvent, read_events
from pipefill.spec import parse
from pipefill_fill.store import read_outputs
from pipefill_fill.task import FillTask, TaskSpec

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TOTAL = 4096  # 16 slices of 256 with maxParallelRanks 4
PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "batchSizes": [1, 4, 16], "commitEverySamples": 64}


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[list[RankExecutor]]:
    started: list[RankExecutor] = []
    yield started
    for r in started:
        r.stop()


@pytest.fixture
def operator(operator_kubeconfig: Path, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    proc = start_queue_operator(operator_kubeconfig, tmp_path / "operator.log", namespace)
    yield proc
    proc.stop()


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


def _committed(obj: dict[str, Any]) -> int:
    return sum(s["committed"] - s["start"] for s in status(obj).get("slices") or ())


def test_a_split_job_survives_a_deleted_host_with_identical_outputs(
    control_plane: ControlPlane,
    kube: Kube,
    namespace: str,
    operator: OperatorProcess,
    ranks: list[RankExecutor],
    tmp_path: Path,
) -> None:
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

    def frozen_midway(obj: dict[str, Any]) -> bool:  # the frozen one has committed part of the slice it holds
        mine = {(a["start"], a["end"]) for a in status(obj).get("assignments") or () if a["podUID"] == frozen.uid}
        return any(
            s["start"] < s["committed"] < s["end"] for s in status(obj)["slices"] if (s["start"], s["end"]) in mine
        )

    fill.wait("embed", frozen_midway, timeout_s=180)
    frozen.signal(signal.SIGSTOP)  # a lost node: the process outlives its pod and hears nothing
    held = {(a["start"], a["end"]): a for a in status(fill.get("embed"))["assignments"] if a["podUID"] == frozen.uid}
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "pipelinetrainingjobs", "first")
    other.signal(signal.SIGTERM)  # the kubelet's stop: it commits what it has and exits

    second_uids = {p["metadata"]["uid"] for p in hosts["second"]}
    moved = fill.wait(
        "embed",
        lambda o: (
            bool(held)
            and all(
                any(
                    (a["start"], a["end"]) == k and a["podUID"] in second_uids
                    for a in status(o).get("assignments") or ()
                )
                or any((s["start"], s["end"]) == k and s["committed"] == s["end"] for s in status(o)["slices"])
                for k in held
            )
        ),
        timeout_s=180,
    )
    takeover: dict[tuple[int, int], int] = {}  # where the new owner of each frozen slice resumed

    def taken_over() -> bool:
        for r in ranks[2:]:
            for e in read_events(r.out / "fill-events.jsonl"):
                if isinstance(e, SliceEvent) and e.phase in ("claimed", "done") and (e.start, e.end) in held:
                    takeover.setdefault((e.start, e.end), e.position)
        return set(takeover) == set(held)

    fill.wait("embed", lambda o: taken_over() or _committed(o) == TOTAL, timeout_s=180)
    frozen.signal(signal.SIGCONT)  # thawed: it must write nothing more
    done = fill.wait("embed", lambda o: status(o).get("phase") == "Succeeded", timeout_s=300)
    stale_log = frozen.stop()

    st = status(done)
    assert all(s["committed"] == s["end"] for s in st["slices"]) and st["samplesDone"] == TOTAL
    out = tmp_path / "storage" / "embed"
    assert (out / "outputs.npy").read_bytes() == reference  # zero samples lost or repeated, bytes identical
    assert read_outputs(out)["sample_id"].tolist() == list(range(TOTAL))
    assert all(
        a["epoch"] > held[k]["epoch"]
        for k, a in ((k, a) for a in status(moved)["assignments"] for k in held if (a["start"], a["end"]) == k)
    )
    assert any(pos > start for (start, _), pos in takeover.items()), "no slice resumed mid-way from its commit"
    commits = [e for e in read_events(frozen.out / "fill-events.jsonl") if isinstance(e, CommitEvent)]
    for e in commits:
        key = (e.slice[0], e.slice[1]) if e.slice else None
        if key in takeover:
            assert (e.position or 0) <= takeover[key], f"the frozen executor committed {e} past the takeover"
    assert "stale executor refused at commit" in stale_log or "letting go of slice" in stale_log, stale_log[-2000:]


def test_an_unfit_report_from_a_real_executor_moves_the_job(
    control_plane: ControlPlane,
    kube: Kube,
    namespace: str,
    operator: OperatorProcess,
    ranks: list[RankExecutor],
    tmp_path: Path,
) -> None:
    """The executor of a rank whose bubbles (3 ms) are shorter than the job's shortest step (a heavier encoder,
    several ms) profiles it, reports ``unfit`` with the numbers and lets go; the operator moves the job to a roomy
    host, whose executor completes it."""
    kube.create_job(namespace, job_manifest("tight"))
    kube.wait_pods(namespace, "tight", running(2))
    kube.wait_job(namespace, "tight", phase("Running"))
    heavy = {"layers": 4, "hiddenSize": 256, "heads": 4, "seqLen": 128, "batchSizes": [1, 4]}
    manifest = fill_manifest(
        "heavy",
        workload={"kind": "inference", "builtin": "encoder-inference", "parameters": heavy},
        output={"path": str(tmp_path / "storage" / "heavy")},
        totalSamples=64,
    )
    fill = Fill(kube, namespace)
    fill.create(manifest)
    (placed,) = status(fill.wait("heavy", lambda o: len(status(o).get("assignments") or ()) == 1))["assignments"]
    pods = {p["metadata"]["uid"]: p for p in kube.wait_pods(namespace, "tight", running(2))}
    ranks.append(
        start_rank(control_plane, namespace, pods[placed["podUID"]], job="tight", workdir=tmp_path, bubbles_ms="3")
    )
    reported = fill.wait("heavy", lambda o: bool(status(o).get("unfit")), timeout_s=240)
    (unfit,) = status(reported)["unfit"]
    assert (unfit["trainingJob"], unfit["rank"], unfit["reason"]) == ("tight", placed["rank"], "BubbleTooShort")
    assert unfit["stepMilliseconds"] > unfit["longestBubbleMilliseconds"] and unfit["freeBytes"] > 0
    assert status(reported)["profile"] and status(reported)["profile"][0]["batchSize"] == 1
    kube.create_job(namespace, job_manifest("roomy"))
    roomy = kube.wait_pods(namespace, "roomy", running(2))
    moved = fill.wait(
        "heavy",
        lambda o: [a["trainingJob"] for a in status(o).get("assignments") or ()] == ["roomy"],
        timeout_s=120,
    )
    (now,) = status(moved)["assignments"]
    assert now["epoch"] > placed["epoch"]
    pod = next(p for p in roomy if p["metadata"]["uid"] == now["podUID"])
    ranks.append(start_rank(control_plane, namespace, pod, job="roomy", workdir=tmp_path, bubbles_ms="60,120"))
    fill.wait("heavy", lambda o: status(o).get("phase") == "Succeeded", timeout_s=300)
    assert read_outputs(tmp_path / "storage" / "heavy")["sample_id"].tolist() == list(range(64))
