"""``pipefill bench colocation``: the quick mode end to end with real processes, its refusals, and the naive fill
runner's exactly-once progress. Benchmarks are not tests: nothing here asserts on speed, only on shape and sense."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import launched
import numpy as np
import pytest
import torch
import yaml
from sharing import own_core
from waiting import wait_for

from pipefill import env
from pipefill.bench import colocation
from pipefill.events import CommitEvent, FillEvent, JobEvent, ProfileEvent, WorkEvent, read_events
from pipefill.local.idle import WORK
from pipefill.spec import load_file

RUN_KEYS = {
    "schedule",
    "stages",
    "microbatches",
    "slowdown",
    "slowdown_ci",
    "bubble_recovery",
    "announced_recovery",
    "targets_met",
    "blocked",
    "separate",
}
SEPARATE_KEYS = {
    "baseline_step_s",
    "pipefill_step_s",
    "naive_step_s",
    "slowdown_pipefill",
    "slowdown_naive",
    "bubble_fraction",
    "bubble_recovery",
    "fill_items_per_s_pipefill",
    "fill_items_per_s_naive",
    "reps",
}


@pytest.mark.busy  # both cores busy, but nothing timed is asserted: beside a shared test, not alone (tests/sharing.py)
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_quick_run_measures_the_blocked_run_and_all_three_modes_consistently() -> None:
    done = launched.run(  # forked from the tests' launcher: so is its own (pipefill/local/forker.py)
        [sys.executable, "-m", "pipefill", "bench", "colocation", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=235,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["command"] == "pipefill bench colocation --quick --json"
    assert {"cores", "cpu_model", "torch"} <= out["machine"].keys() and out["machine"]["torch"]
    (run,) = out["runs"]
    assert run.keys() >= RUN_KEYS and run["separate"].keys() >= SEPARATE_KEYS
    assert (run["schedule"], run["stages"], run["microbatches"]) == ("1f1b", 2, 4)
    # the blocked run: A B A B A inside one training run, each B between two A blocks
    blocked = run["blocked"]
    labels = [b["label"] for b in blocked["blocks"]]
    assert labels.count("A") >= 2 and labels.count("B") >= 1 and "BB" not in "".join(labels)
    assert blocked["pairs"] == len(blocked["pair_slowdowns"]) >= 1 and run["slowdown"] == blocked["slowdown"]
    if blocked["pairs"] >= 2:
        lo, hi = run["slowdown_ci"]
        assert lo <= run["slowdown"] <= hi
    assert 0 <= run["bubble_recovery"] <= 1.05 and blocked["idle_s_per_step_alone"] > 0
    for rank in blocked["ranks"]:
        held, on = rank["A"], rank["B"]
        assert held["fill_step_s"] == 0  # held: the fill ran nothing, though the trainer announced
        assert held["announced_bubble_s"] > 0 and on["steps"] > 0
        total = on["idle_breakdown"][-1]
        assert total["kind"] == "all" and sum(total["share"].values()) == pytest.approx(1.0)
        assert sum(total["seconds"].get(k, 0.0) for k in WORK) == pytest.approx(on["fill_step_s"])
    reps = {r["mode"]: r for r in run["separate"]["reps"]}
    assert sorted(reps) == sorted(colocation.MODES) and len(run["separate"]["reps"]) == 3
    separate = run["separate"]
    base, pipefill, naive = reps["baseline"], reps["pipefill"], reps["naive"]
    for r in (base, pipefill, naive):
        assert r["step_s"] > 0 and [x["rank"] for x in r["ranks"]] == [0, 1]
    # training alone: no fill at all, bubbles measured but never announced
    assert base["fill_items_per_s"] == 0 and base["fill_committed"] == 0 and base["announced_bubble_s"] == 0
    assert 0 < separate["bubble_fraction"] < 1
    # PipeFill: the trainers announced bubbles and the fill worked only inside them
    assert pipefill["announced_bubble_s"] > 0 and 0 <= separate["bubble_recovery"] <= 1.05
    # naive: fill progress made and committed, without looking at a single bubble
    assert separate["fill_items_per_s_naive"] > 0 and naive["fill_committed"] > 0 and naive["bubble_recovery"] == 0
    assert separate["slowdown_naive"] == pytest.approx(naive["step_s"] / base["step_s"] - 1)
    assert separate["slowdown_pipefill"] == pytest.approx(pipefill["step_s"] / base["step_s"] - 1)
    assert separate["slowdown_pipefill_per_rep"] == [pytest.approx(separate["slowdown_pipefill"])]
    assert not base["fill_notes"] and not naive["fill_notes"]  # the executor's own notes are its business


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--schedules", "zbv"], "--schedules"),
        (["--replay", "--replay-stages", "0,8"], "--replay-stages"),
        (["--cores", "0"], "need one core each"),
        (["--warmup-steps", "2"], "--warmup-steps"),
        (["--block-steps", "1"], "--block-steps"),
        (
            ["--microbatches", "1"],
            "spec.pipeline.microbatches: Invalid value: 1: spec.pipeline.microbatches 1 is fewer",
        ),
    ],
)
def test_bad_options_are_refused_with_the_option_named(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert colocation.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: --device cuda would run")
def test_device_cuda_without_a_gpu_fails_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    assert colocation.main(["--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "0 visible" in err and "--device cpu" in err


# -- the naive fill runner --------------------------------------------------------------------------------------------

PARAMS = {"layers": 1, "hiddenSize": 32, "heads": 2, "seqLen": 16, "batchSizes": [4]}
TOTAL = 20_000


def _fill_job(directory: Path, output: Path) -> Path:
    doc = {
        "apiVersion": "pipefill.io/v1alpha1",
        "kind": "FillJob",
        "metadata": {"name": "enc"},
        "spec": {
            "workload": {"kind": "inference", "builtin": "encoder-inference", "parameters": PARAMS},
            "output": {"path": str(output)},
            "totalSamples": TOTAL,
        },
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "enc.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _wait_for(what: str, check: Any, timeout_s: float = 60.0) -> None:
    wait_for(check, what, timeout_s)


def _reference_outputs(tmp_path: Path) -> np.ndarray:
    """The job run start to end in this process at the same batch size: what exactly-once must reproduce."""
    from pipefill_fill.store import read_outputs
    from pipefill_fill.task import FillTask, TaskSpec

    (job,) = load_file(_fill_job(tmp_path / "ref-jobs", tmp_path / "ref-out"))
    task = FillTask(TaskSpec.from_spec(job))  # type: ignore[arg-type]
    task.open(device=torch.device("cpu"), memory_budget_bytes=1 << 30)
    while not task.done():
        task.step(4)
    task.finish()
    return read_outputs(tmp_path / "ref-out")


@pytest.mark.busy  # one core and nothing timed (tests/sharing.py)
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_naive_runner_ignores_bubbles_and_commits_exactly_once_across_a_sigkill(tmp_path: Path) -> None:
    from pipefill_fill.store import read_outputs

    jobs, out, log = tmp_path / "jobs", tmp_path / "out", tmp_path / "fill" / "fill-events.jsonl"
    _fill_job(jobs, out)
    cpu = str(own_core())
    environ = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        env.CHANNEL_DIR: str(tmp_path / "channel"),
        env.WORK_SOURCE: f"files:{jobs}",
        env.OUT_DIR: str(tmp_path / "fill"),
        env.DEVICE: "cpu",
        env.CPU_AFFINITY: cpu,
    }
    producer = subprocess.Popen(
        [sys.executable, "-m", "pipefill.bench.synthetic_trainer", "--channel-dir", str(tmp_path / "channel"),
         "--bubbles-ms", "5", "--compute-ms", "5", "--count", "1000000", "--cpu", cpu],
        env=environ, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    naive_cmd = [sys.executable, "-m", "pipefill_fill.bench_worker"]
    try:
        first = launched.popen(naive_cmd, env=environ, stderr=subprocess.DEVNULL)  # torch preloaded (tests/launched.py)
        _wait_for("a commit", lambda: any(isinstance(e, CommitEvent) for e in read_events(log)))
        first.send_signal(signal.SIGKILL)  # mid-work, uncommitted samples in flight
        first.wait(timeout=10)
        committed_at_kill = max(e.end for e in read_events(log) if isinstance(e, CommitEvent))
        second = launched.popen(naive_cmd, env=environ, stderr=subprocess.PIPE, text=True)
        status = jobs / "enc.status.json"
        _wait_for(
            "the job to succeed", lambda: status.exists() and json.loads(status.read_text())["phase"] == "Succeeded"
        )
    finally:
        producer.kill()
        producer.wait(timeout=10)
    _, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    assert "stopping: trainer gone" in err
    events = read_events(log)
    resumed = [e.committed or 0 for e in events if isinstance(e, JobEvent) and e.phase == "Running"]
    assert resumed[-1] >= committed_at_kill > 0
    assert not any(isinstance(e, FillEvent) for e in events)  # it never waited for one
    assert {e.batch_size for e in events if isinstance(e, ProfileEvent)} == {4}
    work = [e.items for e in events if isinstance(e, WorkEvent) and e.pid == second.pid]
    assert sum(work) == TOTAL - resumed[-1]  # the restart did exactly what was left
    rows = read_outputs(out)
    assert rows["sample_id"].tolist() == list(range(TOTAL))  # every sample exactly once, in order
    assert rows.tobytes() == _reference_outputs(tmp_path).tobytes()  # byte-identical to an uninterrupted run
