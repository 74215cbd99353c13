"""`pipefill local` end to end on a tiny job: real trainer and fill-executor processes, report files that agree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import launched
import pytest
import yaml
from processes import alive
from waiting import wait_for

from pipefill.events import ActionEvent, StepEvent, read_events
from pipefill.local.report import rank_log_paths

pytestmark = [pytest.mark.busy, pytest.mark.slow]  # pipefill local: heavy, untimed (tests/sharing.py)
ROOT = Path(__file__).resolve().parents[2]
LOCAL_ARGS = [sys.executable, "-m", "pipefill", "local"]


def _job(tmp: Path, *, steps: int, fill: bool) -> Path:
    job = yaml.safe_load((ROOT / "examples" / "cpu-demo.yaml").read_text())
    job["spec"]["model"] = {"layers": 2, "hiddenSize": 32, "heads": 2, "seqLen": 16, "vocabSize": 256}
    job["spec"]["data"] = {"source": "synthetic"}
    job["spec"]["steps"] = steps
    job["spec"]["checkpoint"] = {"path": str(tmp / "ckpt"), "intervalSteps": 5}
    job["spec"]["fill"]["enabled"] = fill
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _local(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``pipefill local ARGS``, forked from the tests' preloaded launcher (tests/launched.py), run to its end."""
    return launched.run([*LOCAL_ARGS, *args], capture_output=True, text=True, timeout=110, **kw)


def _start_local(*args: str) -> launched.Proc:
    """``pipefill local ARGS`` started, its output (stdout and stderr) in one pipe."""
    return launched.popen([*LOCAL_ARGS, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_training_alone_writes_reports_that_agree_with_the_event_logs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _local("-f", str(_job(tmp_path, steps=100, fill=False)), "--out", str(out), "--steps", "8")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "training finished" in done.stdout
    report = json.loads((out / "report.json").read_text())
    status = report["outcome"]["status"]  # as the operator's status of a finished job
    assert status["phase"] == "Succeeded" and status["restarts"] == 0
    assert {c["type"]: c["reason"] for c in status["conditions"] if c["status"] == "True"} == {
        "Created": "PodsCreated",
        "Succeeded": "TrainingFinished",
    }
    assert "phase Succeeded, generation 0: Created=True (PodsCreated)" in done.stdout
    steps = [e for e in read_events(out / "ranks" / "0" / "trainer" / "events.jsonl") if isinstance(e, StepEvent)]
    assert report["steps"] == len(steps) == 8
    assert report["loss_last"] == steps[-1].loss
    assert 0 < report["bubble_fraction"] < 1
    trace = json.loads((out / "trace.json").read_text())
    actions = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["tid"] == 1]
    logged = sum(
        1
        for r in (0, 1)
        for e in read_events(out / "ranks" / str(r) / "trainer" / "events.jsonl")
        if isinstance(e, ActionEvent)
    )
    assert len(actions) == logged
    md = (out / "report.md").read_text()
    assert f"loss {report['loss_first']:.3f} → {report['loss_last']:.3f}" in md  # rounded to what it means
    assert md.count(f"| 0 | {100 * report['ranks'][0]['bubble_fraction']:.1f}% |") == 1  # the rank's row
    assert "| 0 | **all** |" in md and "not announced" in md  # where its idle time went: training alone
    assert (out / "timeline.png").stat().st_size > 1000


def test_a_second_run_of_a_finished_job_says_why_it_trained_nothing_and_steps_trains_on(tmp_path: Path) -> None:
    job, out = _job(tmp_path, steps=3, fill=False), tmp_path / "out"
    assert _local("-f", str(job), "--out", str(out), "--no-timeline").returncode == 0
    again = _local("-f", str(job), "--out", str(out), "--no-timeline")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"nothing to train: the checkpoints in {tmp_path / 'ckpt'} are at step 3 of spec.steps 3" in again.stdout
    more = _local("-f", str(job), "--out", str(out), "--steps", "5", "--no-timeline")
    assert more.returncode == 0 and "nothing to train" not in more.stdout, more.stdout + more.stderr
    steps = [e.step for e in read_events(out / "ranks" / "0" / "trainer" / "events.jsonl") if isinstance(e, StepEvent)]
    assert steps == [0, 1, 2, 3, 4]  # three steps, none, then two more from the checkpoint (steps count from 0)
    assert "timeline" not in json.loads((out / "report.json").read_text())["files"]  # --no-timeline
    assert not (out / "timeline.png").exists() and "timeline:" not in more.stdout


def test_invalid_manifest_is_rejected_with_admissions_message(tmp_path: Path) -> None:
    bad = yaml.safe_load((ROOT / "examples" / "cpu-demo.yaml").read_text())
    bad["spec"]["pipeline"]["globalBatch"] = 10
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    done = _local("-f", str(path))
    assert done.returncode == 2
    assert "spec.pipeline.globalBatch: Invalid value: 10" in done.stderr


def test_ctrl_c_stops_every_process_and_keeps_checkpoints(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with _start_local("-f", str(_job(tmp_path, steps=100000, fill=False)), "--out", str(out), "--no-timeline") as proc:
        try:
            events = out / "ranks" / "0" / "trainer" / "events.jsonl"
            wait_for(lambda: sum(isinstance(e, StepEvent) for e in read_events(events)) >= 6, "6 steps", timeout_s=90)
            proc.send_signal(signal.SIGINT)
            output, _ = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 130, output
    assert "interrupted" in output
    assert (tmp_path / "ckpt").exists()
    children = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert [c for c in children if int(c) != os.getpid()] == []


def _child_pid(out: Path, rank: int, container: str) -> int | None:
    """The pid of the live local process that runs ``container`` of ``rank``: the last its event log names (a child
    forked from the preloaded launcher has the launcher's /proc environ, so that does not tell)."""
    trainer_log, fill_log = rank_log_paths(out, rank)
    events = read_events(trainer_log if container == "trainer" else fill_log)
    if not events:
        return None
    pid = events[-1].pid
    return pid if alive(pid) else None


def test_sigkill_of_a_fill_executor_restarts_it_and_of_a_trainer_restarts_the_job(tmp_path: Path) -> None:
    """A killed sidecar is restarted while training goes on. A killed trainer is exit code 137 as on a kubelet
    (128 + SIGKILL), retryable by default (restartOnExitCodes 75, 137, 143): the whole job restarts from its
    checkpoints and trains on, as the operator restarts the gang. (Before exit codes were classified alike on both
    runners, a SIGKILL ended the local run.) Ctrl-C then stops everything and no process is left behind."""
    out = tmp_path / "out"
    fill = yaml.safe_load((ROOT / "examples" / "fill-inference.yaml").read_text())
    fill["spec"]["output"]["path"] = str(tmp_path / "fill-out")
    (tmp_path / "fill.yaml").write_text(yaml.safe_dump(fill))
    job = _job(tmp_path, steps=100000, fill=True)
    with _start_local(
        "-f", str(job), "-f", str(tmp_path / "fill.yaml"), "--out", str(out), "--metrics-port", "0", "--no-timeline"
    ) as proc:
        try:
            events = out / "ranks" / "1" / "trainer" / "events.jsonl"

            def steps() -> list[int]:
                return [e.step for e in read_events(events) if isinstance(e, StepEvent)]

            wait_for(lambda: len(steps()) >= 3, "3 steps", timeout_s=90)
            # at SCHED_IDLE in the trainer's scheduling group, the executor starts in the time its trainer leaves
            fill_pid = wait_for(lambda: _child_pid(out, 0, "fill-executor"), "the executor's first record", 90)
            os.kill(fill_pid, signal.SIGKILL)
            wait_for(
                lambda: _child_pid(out, 0, "fill-executor") not in (None, fill_pid), "a new executor", timeout_s=90
            )  # restarted: a new process
            steps_then = len(steps())
            wait_for(lambda: len(steps()) > steps_then + 2, "training on", timeout_s=90)
            trainer_pid = _child_pid(out, 1, "trainer")
            assert trainer_pid is not None
            # forked from the run's preloaded launcher (torch imported once), shown in ps as its own command
            parent = int(Path(f"/proc/{trainer_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            assert b"pipefill.local.launcher" in Path(f"/proc/{parent}/cmdline").read_bytes()
            assert b"-m pipefill_trainer" in Path(f"/proc/{trainer_pid}/cmdline").read_bytes()
            os.kill(trainer_pid, signal.SIGKILL)
            wait_for(
                lambda: _child_pid(out, 1, "trainer") not in (None, trainer_pid), "a new trainer", timeout_s=90
            )  # the whole job restarted
            killed_at = len(steps())
            wait_for(
                lambda: len(steps()) > killed_at + 2, "training on after the restart", timeout_s=90
            )  # and trains on from its checkpoint
            proc.send_signal(signal.SIGINT)
            output, _ = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 130, output
    # the operator's decision core decided both, so the Events are the cluster's
    restarted = (
        "FillExecutorRestarted: fill-executor sidecars restarted (rank 0: 1, last exited with code 137 (SIGKILL))"
    )
    assert restarted in output
    name = yaml.safe_load((out / "job.yaml").read_text())["metadata"]["name"]
    assert f"Warning TrainerFailed: rank 1 (pod {name}-1): trainer exited with code 137 (SIGKILL): " in output
    assert "restarting the whole job as generation 1 from its checkpoints (restart 1/3)" in output
    resumed = steps()[killed_at:]
    assert resumed[0] > 1  # resumed from a checkpoint, not from step 0
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"]["fill_restarts"] >= 1 and report["outcome"]["job_restarts"] == 1
    status = json.loads((out / "status.json").read_text())
    assert report["outcome"]["status"] == status
    assert (status["phase"], status["generation"], status["restarts"]) == ("Running", 1, 1)
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Running"] == ("True", "AllRanksRunning")
    assert conditions["Restarting"] == ("False", "Restarted")
    reasons = [e["reason"] for e in report["outcome"]["events"]]
    # a new job's first gang posts no PodsCreated or Running Event (its conditions tell it, #29): a restart's does
    assert reasons[:1] == ["FillExecutorRestarted"], reasons
    assert reasons[reasons.index("TrainerFailed") :] == ["TrainerFailed", "PodsCreated", "Running"], reasons
    assert [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()] == report["outcome"]["events"]
    assert all(_child_pid(out, r, c) is None for r in (0, 1) for c in ("trainer", "fill-executor"))


def test_a_killed_runner_takes_its_processes_with_it(tmp_path: Path) -> None:
    """SIGKILL of ``pipefill local`` itself, where nothing can clean up: its trainers and fill executors get SIGTERM
    from the kernel (``PIPEFILL_PARENT_PID``, ``PR_SET_PDEATHSIG``) and stop as on a kubelet's stop, instead of
    training on, orphaned, for the rest of their steps."""
    out = tmp_path / "out"
    job = _job(tmp_path, steps=100000, fill=True)
    proc = launched.popen(
        [*LOCAL_ARGS, "-f", str(job), "--out", str(out), "--metrics-port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    containers = [(r, c) for r in (0, 1) for c in ("trainer", "fill-executor")]
    try:
        events = out / "ranks" / "0" / "trainer" / "events.jsonl"
        wait_for(lambda: sum(isinstance(e, StepEvent) for e in read_events(events)) >= 3, "3 steps", timeout_s=90)
        # the executors log their first record on their own time: a loaded machine showed 3 steps before one had
        wait_for(lambda: all(_child_pid(out, r, c) is not None for r, c in containers), "every child", timeout_s=60)
        proc.kill()
        proc.wait(timeout=10)
        wait_for(lambda: all(_child_pid(out, r, c) is None for r, c in containers), "every child gone", timeout_s=60)
    finally:
        proc.kill()
        proc.wait()  # reaped here, not reported as still running in a later test
        for r, c in containers:  # what a failure left behind
            pid = _child_pid(out, r, c)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
