"""The fill queue's pure parts in the operator: the index merged from events and lists by resourceVersion, the
snapshot it builds (which pods are ranks, which are only live), and the status patch a pass's outcome turns into."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipefill.queue import JobOutcome, Placement, SliceStatus, schedule_pass
from pipefill.queue.fit import Rates
from pipefill.queue.outcome import decide
from pipefill.queue.state import State
from pipefill_operator.cache import ObjectIndex
from pipefill_operator.fillindex import FillIndex

NOW = "2026-01-01T00:00:00Z"
ROOT = Path(__file__).resolve().parents[2]


def _obj(uid: str, rv: int, namespace: str = "ns", name: str | None = None, **rest: Any) -> dict[str, Any]:
    meta = {"uid": uid, "resourceVersion": str(rv), "namespace": namespace, "name": name or uid}
    return {"metadata": meta, **rest}


def test_index_never_takes_an_older_copy_nor_resurrects_a_deleted_uid() -> None:
    index = ObjectIndex()
    assert index.event(_obj("a", 5), deleted=False)
    assert not index.event(_obj("a", 4), deleted=False)  # an older event after a newer write's answer
    assert not index.event(_obj("a", 5), deleted=False)  # the same copy again: no change, no pass
    assert index.event(_obj("a", 6), deleted=True) and "a" not in index.objects
    assert not index.event(_obj("a", 7), deleted=False)  # uids are never reused: a late copy is stale


def test_a_list_removes_only_what_it_lacks_and_the_index_did_not_see_change_after_it() -> None:
    index = ObjectIndex()
    for uid, rv, ns in (("old", 3, "ns"), ("new", 12, "ns"), ("elsewhere", 2, "other")):
        index.event(_obj(uid, rv, ns), deleted=False)
    index.relist([_obj("listed", 9)], 10, namespace="ns")
    # "old" missed its DELETED event: gone; "new" changed after the list: kept; another namespace: untouched
    assert sorted(index.objects) == ["elsewhere", "listed", "new"]
    assert not index.event(_obj("old", 4), deleted=False)


JOB = {
    "apiVersion": "pipefill.io/v1alpha1",
    "kind": "PipelineTrainingJob",
    "spec": {
        "model": {"preset": "gpt-tiny"},
        "pipeline": {"stages": 2, "microbatches": 4, "globalBatch": 8},
        "resources": {"gpus": 1},
        "gpuSharing": {"mode": "visibleDevices"},
    },
    "status": {"phase": "Running", "generation": 1},
}
FILL = {
    "apiVersion": "pipefill.io/v1alpha1",
    "kind": "FillJob",
    "spec": {
        "workload": {"kind": "inference", "builtin": "encoder-inference"},
        "output": {"path": "/data/out"},  # a volume every rank pod mounts: the job is split
        "totalSamples": 1024,
        "maxParallelRanks": 2,
    },
}


def _pod(uid: str, rank: int, generation: int, *, phase: str = "Running", owner: str = "tj") -> dict[str, Any]:
    labels = {"pipefill.io/job-name": "train", "pipefill.io/rank": str(rank), "pipefill.io/generation": str(generation)}
    pod = _obj(uid, 1, name=f"train-0-{rank}-{uid}", status={"phase": phase})
    pod["metadata"].update(labels=labels, ownerReferences=[{"uid": owner}])
    return pod


def test_snapshot_ranks_are_the_running_pods_of_the_current_generation_and_the_rest_stay_live() -> None:
    index = FillIndex()
    index.training_jobs.event({**copy.deepcopy(JOB), **_obj("tj", 1, name="train")}, deleted=False)
    index.fill_jobs.event({**copy.deepcopy(FILL), **_obj("fj", 1, name="embed")}, deleted=False)
    for pod in (_pod("p0", 0, 1), _pod("p1", 1, 1), _pod("old", 1, 0), _pod("pending", 0, 1, phase="Pending")):
        index.pods.event(pod, deleted=False)
    snap = index.snapshot(suspended=set())
    (tj,) = snap.training_jobs
    assert [(r.rank, r.pod_uid) for r in tj.ranks] == [(0, "p0"), (1, "p1")] and tj.running
    assert snap.live_pod_uids == {"old", "pending"}  # their slices would wait for them
    (view,) = snap.fill_jobs
    assert view.phase == "Queued" and view.max_parallel_ranks == 2
    assert index.snapshot(suspended={("ns", "embed")}).fill_jobs[0].phase == "Suspended"
    result = schedule_pass(snap)
    assert [p.pod_uid for p in result.jobs["ns", "embed"].assignments] == ["p0", "p1"]


def _placement(start: int, end: int, epoch: int, rank: int = 0) -> Placement:
    return Placement("embed", start, end, "train", rank, f"train-0-{rank}", f"u{rank}", epoch)


def _outcome(**kw: Any) -> JobOutcome:
    base: dict[str, Any] = dict(
        namespace="ns", name="embed", slices=(SliceStatus(0, 512, 0), SliceStatus(512, 1024, 512)), planned=False,
        assignments=(), new=(), released=(), epoch=0, reason="", code="",
    )  # fmt: skip
    base.update(kw)
    return JobOutcome(**base)


def _fill(status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    obj = {**copy.deepcopy(FILL), **_obj("fj", 1, name="embed"), "status": status}
    obj["spec"].update(spec)
    return obj


SLICES = [{"start": 0, "end": 512, "committed": 0}, {"start": 512, "end": 1024, "committed": 512}]


def test_the_plan_is_written_once_with_the_assignments_and_the_condition() -> None:
    placed = _placement(0, 512, 1)
    out = decide(
        _fill({}), _outcome(planned=True, assignments=(placed,), new=(placed,), epoch=1), running_hosts=set(), now=NOW
    )
    patch = out.patch
    assert patch is not None and patch["slices"] == SLICES and patch["epoch"] == 1 and patch["phase"] == "Running"
    assert patch["output"] == {"path": "/data/out", "files": ["outputs.npy"]}  # where to read the results
    assert patch["assignments"] == [
        {"trainingJob": "train", "rank": 0, "start": 0, "end": 512, "pod": "train-0-0", "podUID": "u0", "epoch": 1}
    ]
    (cond,) = patch["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Scheduled", "True", "Assigned")
    # the same outcome on the written status changes nothing
    again = decide(_fill({**patch}), _outcome(assignments=(placed,), epoch=1), running_hosts=set(), now="later")
    assert again.patch is None
    # a plan in the status is never rewritten, whatever the outcome says
    written = {"slices": [dict(s, committed=s["start"] + 7) for s in SLICES]}
    assert "slices" not in (decide(_fill(written), _outcome(planned=True), running_hosts=set(), now=NOW).patch or {})


def test_waiting_done_suspended_cancelled_and_final() -> None:
    waiting = decide(_fill({"slices": SLICES}), _outcome(code="NoMatchingHost", reason="hostSelector {a=b} matches no running training job"), running_hosts=set(), now=NOW).patch  # fmt: skip
    assert (
        waiting is not None and waiting["phase"] == "Queued" and waiting["conditions"][0]["reason"] == "NoMatchingHost"
    )
    assert waiting["message"].startswith("hostSelector")

    # every slice committed is not Succeeded: the placement that completes the job stays until an executor reports
    done = [dict(s, committed=s["end"]) for s in SLICES]
    completer = _placement(512, 1024, 4)
    committed = decide(_fill({"slices": done, "phase": "Running"}), _outcome(assignments=(completer,), epoch=4), running_hosts=set(), now=NOW).patch  # fmt: skip
    assert committed is not None and "phase" not in committed and committed["samplesDone"] == 1024
    assert [a["start"] for a in committed["assignments"]] == [512]
    (cond,) = committed["conditions"]
    assert (cond["status"], cond["reason"]) == ("True", "Completing") and "train/0 completes the job" in cond["message"]
    reported = {"slices": done, "phase": "Succeeded", "assignments": committed["assignments"], "conditions": [cond]}
    finished = decide(_fill(reported), _outcome(), running_hosts=set(), now=NOW).patch
    assert finished is not None and finished["assignments"] == []
    (cond,) = finished["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "Completed")

    held = _placement(0, 512, 3)
    suspended = decide(_fill({"slices": SLICES, "phase": "Running"}, suspend=True), _outcome(released=(held,)), running_hosts=set(), now=NOW)  # fmt: skip
    assert suspended.patch is not None and suspended.patch["phase"] == "Queued" and suspended.patch["assignments"] == []
    assert [(p, r) for p, r in suspended.released] == [(held, "suspended")]

    cancelled = decide(_fill({"slices": SLICES}, cancel=True), None, running_hosts=set(), now=NOW).patch
    assert cancelled is not None and cancelled["phase"] == "Cancelled" and cancelled["completionTime"] == NOW

    final = decide(_fill({"phase": "Failed", "assignments": [{"x": 1}]}), _outcome(), running_hosts=set(), now=NOW)
    assert final.patch == {"assignments": []}


def test_unfit_reports_are_kept_while_their_host_runs_and_released_slices_are_counted_by_cause() -> None:
    unfit = [{"trainingJob": "train", "rank": 0, "reason": "BubbleTooShort"}, {"trainingJob": "gone", "rank": 1, "reason": "NotEnoughMemory"}]  # fmt: skip
    moved = _placement(512, 1024, 4, rank=1)
    lost = _placement(0, 512, 2, rank=0)
    out = decide(
        _fill({"slices": SLICES, "unfit": unfit}),
        _outcome(released=(lost,), assignments=(moved,), new=(moved,), epoch=4),
        running_hosts={("ns", "train")},
        now=NOW,
    )
    assert out.patch is not None and out.patch["unfit"] == unfit[:1]
    assert [reason for _, reason in out.released] == ["unfit"]


def test_the_policy_flag_and_its_environment_variable_are_checked_before_connecting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipefill_operator.__main__ import POLICY_ENV, main

    assert main(["--policy", "lifo"]) == 2
    assert "'lifo' is not one of fifo, priority, sjf, deadline, makespan" in capsys.readouterr().err
    monkeypatch.setenv(POLICY_ENV, "shortest")
    assert main([]) == 2
    assert f"${POLICY_ENV}" in capsys.readouterr().err
    monkeypatch.setenv(POLICY_ENV, "sjf")
    monkeypatch.setenv("PIPEFILL_FILL_MAX_ACTIVE_JOBS", "0")
    assert main([]) == 2
    assert "PIPEFILL_FILL_MAX_ACTIVE_JOBS=0 must be ≥ 1" in capsys.readouterr().err


def test_a_long_reason_is_cut_to_the_status_bound() -> None:
    out = decide(_fill({"slices": SLICES}), _outcome(code="Unfit", reason="x" * 9000), running_hosts=set(), now=NOW)
    assert out.patch is not None and len(out.patch["message"]) == 4096


def test_a_custom_schedules_unreported_ranks_are_predicted_from_the_csv_its_reconcile_read() -> None:
    """Until its executors report bubbles, a training job's ranks are planned with the simulator's prediction; for
    schedule ``custom`` that needs the CSV from the user's ConfigMap, which the reconcile reads and hands over."""
    docs = list(yaml.safe_load_all((ROOT / "examples" / "custom-schedule" / "custom-demo.yaml").read_text()))
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (job,) = [d for d in docs if d["kind"] == "PipelineTrainingJob"]
    index = FillIndex()
    body = {**copy.deepcopy(job), **_obj("tj", 1, name="train"), "status": {"phase": "Running", "generation": 1}}
    # a model whose predicted bubbles (on the prediction's H100) outlast minBubbleMilliseconds
    body["spec"]["model"] = {"layers": 24, "hiddenSize": 2048, "heads": 16, "seqLen": 2048, "vocabSize": 50304}
    index.training_jobs.event(body, deleted=False)
    for pod in (_pod("p0", 0, 1), _pod("p1", 1, 1)):
        index.pods.event(pod, deleted=False)

    def capacities() -> list[Any]:
        snap = index.snapshot(suspended=set())
        return [h.cap for h in State(snap, max_jobs=1, rates=Rates()).hosts]

    assert [c.known for c in capacities()] == [False, False]  # no CSV yet: learnt by placing
    index.schedule_csvs["ns", "train"] = cm["data"]["schedule.csv"]
    assert index.snapshot(suspended=set()).training_jobs[0].schedule_csv == cm["data"]["schedule.csv"]
    known = capacities()
    assert [c.known for c in known] == [True, True] and all(c.classes for c in known)
    index.training_jobs.event(_obj("tj", 2, name="train"), deleted=True)
    index.snapshot(suspended=set())
    assert index.schedule_csvs == {}  # forgotten with its job
