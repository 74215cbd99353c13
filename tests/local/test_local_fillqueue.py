"""`pipefill local`'s FillJob queue is the operator's: the same pass, the same status it writes, the same reasons.

The queue runs here over status files and processes seen as pods; the comparison runs the operator's own index over the
same FillJobs as cluster objects, so a reason text that differs fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from manifests import fill_job

from pipefill.lifecycle import PodView
from pipefill.local.adapter import pod_uid
from pipefill.local.fillqueue import LocalQueue
from pipefill.queue import schedule_pass
from pipefill.queue.outcome import decide
from pipefill.queue.status import QUEUE_MARKER
from pipefill.spec import FillJob, PipelineTrainingJob, parse, to_obj
from pipefill_operator.fillindex import FillIndex

NOW = "2026-01-01T00:00:00Z"
JOB = {
    "apiVersion": "pipefill.io/v1alpha1",
    "kind": "PipelineTrainingJob",
    "metadata": {"name": "train"},
    "spec": {"model": {"preset": "gpt-tiny"}, "pipeline": {"stages": 2, "microbatches": 4, "globalBatch": 8}},
}


def _job() -> PipelineTrainingJob:
    job = parse(JOB)
    assert isinstance(job, PipelineTrainingJob)
    return job


def _fill(name: str, *, priority: int = 0, total: int = 4096, parallel: int = 2) -> FillJob:
    fill = parse(fill_job(name, output=f"out/{name}", totalSamples=total, maxParallelRanks=parallel, priority=priority))
    assert isinstance(fill, FillJob)
    return fill


def _pods(*ranks: int, generation: int = 0) -> list[PodView]:
    return [PodView(f"train-{r}", r, generation, "Running", False, trainer_running=True) for r in ranks]


def _status(work: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((work / f"{name}.status.json").read_text())
    return data


def _finish(work: Path, name: str) -> None:
    """What the executor that completes a job writes: every slice committed, Succeeded."""
    status = _status(work, name)
    for s in status["slices"]:
        s["committed"] = s["end"]
    status.update(phase="Succeeded", samplesDone=status["slices"][-1]["end"])
    (work / f"{name}.status.json").write_text(json.dumps(status))


@pytest.mark.parametrize(("policy", "first"), [("priority", "urgent"), ("fifo", "routine")])
def test_the_policy_decides_which_job_takes_the_ranks_first_and_the_other_follows(
    tmp_path: Path, policy: str, first: str
) -> None:
    fills = [_fill("routine"), _fill("urgent", priority=10)]  # given in this order: fifo's creation order
    queue = LocalQueue(_job(), fills, tmp_path, policy=policy, max_jobs_per_rank=1)
    assert json.loads((tmp_path / QUEUE_MARKER).read_text()) == {"policy": policy}  # the executors follow it
    queue.pass_once(_pods(0, 1), running=True)
    second = "urgent" if first == "routine" else "routine"
    placed = _status(tmp_path, first)
    assert placed["phase"] == "Running" and len(placed["assignments"]) == 2
    assert {a["podUID"] for a in placed["assignments"]} == {pod_uid(_job(), 0, 0), pod_uid(_job(), 0, 1)}
    waiting = _status(tmp_path, second)
    assert waiting["phase"] == "Queued" and waiting["assignments"] == []
    (scheduled,) = waiting["conditions"]
    assert (scheduled["type"], scheduled["status"], scheduled["reason"]) == ("Scheduled", "False", "NoFreeRank")
    _finish(tmp_path, first)
    queue.pass_once(_pods(0, 1), running=True)
    assert len(_status(tmp_path, second)["assignments"]) == 2 and _status(tmp_path, first)["assignments"] == []


def test_nothing_is_placed_until_the_job_runs_and_a_new_generation_moves_the_slices_at_a_new_epoch(
    tmp_path: Path,
) -> None:
    queue = LocalQueue(_job(), [_fill("embed")], tmp_path, max_jobs_per_rank=2)
    queue.pass_once(_pods(0, 1), running=False)
    assert _status(tmp_path, "embed").get("assignments") in (None, [])
    queue.pass_once(_pods(0, 1), running=True)
    before = _status(tmp_path, "embed")
    assert {a["epoch"] for a in before["assignments"]} == {1, 2}
    queue.pass_once(_pods(0, 1, generation=1), running=True)  # the gang restarted: new pods
    after = _status(tmp_path, "embed")
    assert {a["podUID"] for a in after["assignments"]} == {pod_uid(_job(), 1, 0), pod_uid(_job(), 1, 1)}
    assert {a["epoch"] for a in after["assignments"]} == {3, 4} and after["epoch"] == 4


def test_a_write_that_raced_an_executors_report_is_dropped_and_decided_again(tmp_path: Path) -> None:
    queue = LocalQueue(_job(), [_fill("embed")], tmp_path, max_jobs_per_rank=2)
    queue.pass_once(_pods(0, 1), running=True)
    seen = _status(tmp_path, "embed")
    reported = {**seen, "samplesDone": 5}
    (tmp_path / "embed.status.json").write_text(json.dumps(reported))  # an executor's report since the pass read it
    assert not queue._write("embed", seen, {"message": "stale"})
    assert _status(tmp_path, "embed") == reported


def _cluster_condition(job: PipelineTrainingJob, fill: FillJob, status: dict[str, Any]) -> dict[str, Any]:
    """The Scheduled condition the operator writes for ``fill`` with ``status`` beside ``job``'s two Running pods."""
    index = FillIndex()
    tj = {**to_obj(job), "status": {"phase": "Running", "generation": 0}}
    tj["metadata"] = {"name": job.name, "namespace": "default", "uid": "tj", "resourceVersion": "1"}
    index.training_jobs.event(tj, deleted=False)
    body = {**to_obj(fill), "status": status}
    body["metadata"] = {"name": fill.name, "namespace": "default", "uid": "fj", "resourceVersion": "1"}
    index.fill_jobs.event(body, deleted=False)
    for rank in (0, 1):
        labels = {"pipefill.io/rank": str(rank), "pipefill.io/generation": "0", "pipefill.io/job-name": job.name}
        meta = {"name": f"train-{rank}", "namespace": "default", "uid": pod_uid(job, 0, rank), "resourceVersion": "1"}
        meta.update(labels=labels, ownerReferences=[{"uid": "tj"}])
        index.pods.event({"metadata": meta, "status": {"phase": "Running"}}, deleted=False)
    result = schedule_pass(index.snapshot(suspended=set()), policy="fifo", max_jobs_per_rank=2)
    patch = decide(body, result.jobs[("default", fill.name)], running_hosts={("default", job.name)}, now=NOW).patch
    assert patch is not None
    (condition,) = patch["conditions"]
    return dict(condition)


def test_a_job_every_rank_reported_unfit_waits_with_the_reason_text_the_cluster_shows(tmp_path: Path) -> None:
    job, fill = _job(), _fill("big", parallel=1)
    queue = LocalQueue(job, [fill], tmp_path, max_jobs_per_rank=2)
    queue.pass_once(_pods(0, 1), running=True)
    status = _status(tmp_path, "big")
    unfit = [
        {"trainingJob": "train", "rank": r, "reason": "BubbleTooShort", "message": f"rank {r}: no batch fits 2 ms"}
        for r in (0, 1)
    ]
    status.update(unfit=unfit)  # what both ranks' executors report when they let go of the job
    (tmp_path / "big.status.json").write_text(json.dumps(status))
    queue.pass_once(_pods(0, 1), running=True)
    local = _status(tmp_path, "big")
    (condition,) = local["conditions"]
    assert (condition["reason"], local["phase"], local["assignments"]) == ("Unfit", "Queued", [])
    cluster = _cluster_condition(job, fill, status)
    assert (condition["reason"], condition["message"]) == (cluster["reason"], cluster["message"])
    assert local["message"] == condition["message"] and "no batch fits 2 ms" in condition["message"]


def test_a_pass_on_what_the_last_one_saw_is_not_run_again_until_its_period_ends(tmp_path: Path) -> None:
    """As the operator's loop passes on events: unchanged status files, pods and phase decide nothing new (with 100
    FillJobs a pass was 12-19 ms of the runner's CPU, 5 times a second); a change, or the period, runs one."""
    queue = LocalQueue(_job(), [_fill("routine"), _fill("urgent")], tmp_path, max_jobs_per_rank=1, period_s=3600)
    queue.pass_once(_pods(0, 1), running=True)  # writes the routine job's assignments
    settled = queue.pass_once(_pods(0, 1), running=True)  # its own writes are inputs: decided again, nothing written
    written = (tmp_path / "routine.status.json").stat().st_mtime_ns
    assert queue.pass_once(_pods(0, 1), running=True) is settled  # nothing changed: the last result stands
    assert (tmp_path / "routine.status.json").stat().st_mtime_ns == written
    assert queue.pass_once(_pods(0), running=True) is not settled  # a pod went: passed again
    queue.pass_once(_pods(0, 1), running=True)
    queue.pass_once(_pods(0, 1), running=True)
    _finish(tmp_path, "routine")  # an executor's report: the next pass sees it
    queue.pass_once(_pods(0, 1), running=True)
    assert len(_status(tmp_path, "urgent")["assignments"]) == 2
    every = LocalQueue(_job(), [_fill("again")], tmp_path / "b", max_jobs_per_rank=1, period_s=0.0)
    first = every.pass_once(_pods(0, 1), running=True)
    assert every.pass_once(_pods(0, 1), running=True) is not first  # period 0: a pass every time
