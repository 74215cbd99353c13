"""Under `pipefill local` the FillJobs go through the operator's queue: by priority, the urgent job takes the ranks
first and the routine one (given first: fifo would start it) runs after it, as the cluster would order them.

Claims, not commits, tell the order: a slice's commits depend on the bubbles it got, its claim on the queue alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import launched
import pytest
import yaml
from manifests import fill_job
from test_local_run import LOCAL_ARGS, _job
from waiting import wait_for

from pipefill import env
from pipefill.events import SliceEvent, read_events
from pipefill.local.report import FILL_WORK_DIR, rank_log_paths

pytestmark = [pytest.mark.busy, pytest.mark.slow]  # pipefill local: heavy, untimed (tests/sharing.py)


def _fill(tmp: Path, name: str, priority: int) -> Path:
    doc = fill_job(
        name,
        output=str(tmp / "fill-out" / name),
        parameters={"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16},
        totalSamples=128,  # two slices of 64: one per rank at once
        priority=priority,
        maxParallelRanks=2,
        minSliceSamples=64,
        hostSelector={"matchLabels": {"pipefill.io/fill-pool": "demo"}},
    )
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _status(out: Path, name: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((out / FILL_WORK_DIR / f"{name}.status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data


def test_two_fill_jobs_run_in_priority_order_through_the_queue(tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = _job(tmp_path, steps=100000, fill=True)
    # a wider stage than _job's: waits of milliseconds the fill can use (at hidden 32 its announced waits mostly
    # ended before the fill's planned end could start a step, and 64 samples took from 1 to 90 s)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["model"].update(hiddenSize=128, seqLen=32)
    job.write_text(yaml.safe_dump(doc))
    files = ["-f", str(job), "-f", str(_fill(tmp_path, "routine", 0)), "-f", str(_fill(tmp_path, "urgent", 10))]
    # one fill job per rank at a time: the urgent job's two slices take both ranks first
    child_env = {**os.environ, env.FILL_MAX_ACTIVE_JOBS: "1"}
    args = [*LOCAL_ARGS, *files, "--out", str(out), "--policy", "priority", "--metrics-port", "0", "--plain",
            "--no-timeline"]  # fmt: skip
    with launched.popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env) as proc:
        try:
            # once the urgent job's first slice is committed its rank is free and takes the routine job while the
            # other rank may still be on the urgent job's second slice: wait for both (8-10 s on an idle machine)
            wait_for(
                lambda: all(_status(out, name).get("phase") == "Succeeded" for name in ("urgent", "routine")),
                "both FillJobs Succeeded",
                timeout_s=90,
            )
            proc.send_signal(signal.SIGINT)
            output, _ = proc.communicate(timeout=20)
        finally:
            proc.kill()
    assert proc.returncode == 130, output
    # where the executors took slices, as the queue assigned them (their "claimed" records)
    claims = sorted(
        (e.wall_s, e.job, e.start)
        for r in (0, 1)
        for e in read_events(rank_log_paths(out, r)[1])
        if isinstance(e, SliceEvent) and e.phase == "claimed"
    )
    urgent = {start: t for t, name, start in reversed(claims) if name == "urgent"}  # each slice's first claim
    routine = [t for t, name, _ in claims if name == "routine"]
    assert len(urgent) == 2 and routine, claims
    # both urgent slices held both ranks before the routine job got one (fifo would have started it first)
    assert max(urgent.values()) < min(routine), claims
    assert _status(out, "urgent")["phase"] == "Succeeded"
    # the queue, not the executors, placed them: assignments with pod uids and epochs, the Scheduled condition
    routine_status = _status(out, "routine")
    assert routine_status["epoch"] == 2 and routine_status["phase"] == "Succeeded"
    assert all(a["podUID"].startswith("local-cpu-demo-g0-r") for a in routine_status["assignments"])
    scheduled = {c["type"]: c for c in routine_status["conditions"]}["Scheduled"]
    assert scheduled["reason"] in ("Assigned", "Completing", "Completed"), scheduled
