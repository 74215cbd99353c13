"""``pipefill bench hook`` runs end to end on a tiny configuration (speed is never asserted in tests), its summary
is the paired ratio it documents, and what it cannot measure is an error naming the run and the rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipefill.bench.hook import RunResult, summarize


def _bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipefill", "bench", "hook", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.busy  # a benchmark's runs: heavy, nothing timed is asserted (tests/sharing.py)
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_hook_times_both_modes_the_hooks_predictions_and_both_recoveries(tmp_path: Path) -> None:
    steps, skip = 10, 5
    args = ["--json", "--pairs", "1", "--steps", str(steps), "--skip-steps", str(skip), "--keep", str(tmp_path)]
    done = _bench(*args, "--recovery", timeout=200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["hook"] for r in result["runs"]] == [False, True, False], "A B A"
    assert all(r["steps_timed"] == steps - skip for r in result["runs"]), result["runs"]
    assert result["ratio"] > 0 and len(result["pair_ratios"]) == 1 and result["ratio_ci"] is None  # one pair
    assert result["unhooked_step_s_median"] > 0 and result["hooked_step_s_median"] > 0
    assert result["bubbles_announced"] > 0 and result["bubbles_measured"] > 0
    assert result["bubble_prediction_error_median"] >= 0
    # the hook's own time: some, and far less than the step it is part of
    assert 0 < result["hook_own_s_median"] < result["hooked_step_s_median"] / 2
    assert result["hook_own_share"] == pytest.approx(result["hook_own_s_median"] / result["hooked_step_s_median"])
    # the hook ran in the B run only: its event log and channel there, none in the A runs
    assert (tmp_path / "run01-hooked" / "rank0" / "events.jsonl").is_file()
    assert not (tmp_path / "run00-plain" / "rank0").exists()
    # the unchanged command computed the same in both modes (rank 0 prints every step's loss)
    losses = [
        [line for line in (tmp_path / run / "output0.log").read_text().splitlines() if line.startswith("step ")]
        for run in ("run00-plain", "run01-hooked", "run02-plain")
    ]
    assert len(losses[0]) == steps and losses[0] == losses[1] == losses[2]
    # --recovery: the hooked command and our trainer, each under pipefill local with the inference FillJob
    hooked, ours = result["recovery"]["hooked"], result["recovery"]["ours"]
    assert (hooked["trainer"], ours["trainer"]) == ("hooked command", "ours")
    assert hooked["steps"] == ours["steps"] == steps
    assert hooked["bubble_fraction"] > 0 and ours["bubble_fraction"] > 0, result["recovery"]
    assert hooked["bubble_recovery"] is not None and ours["bubble_recovery"] is not None


def test_a_failing_command_is_an_error_naming_the_run_and_the_rank(tmp_path: Path) -> None:
    command = f'{sys.executable} -c \'import os, sys; sys.exit(3 if os.environ["RANK"] == "1" else 0)\''
    done = _bench("--command", command, "--pairs", "1", "--keep", str(tmp_path), timeout=60)
    assert done.returncode == 1
    assert "unhooked run in" in done.stderr and "rank 1 exited 3" in done.stderr, done.stderr


def test_too_few_steps_to_time_is_refused_with_the_fix() -> None:
    done = _bench("--steps", "5", "--skip-steps", "5", timeout=60)
    assert done.returncode == 2 and "--steps 5 must exceed --skip-steps 5" in done.stderr, done.stderr


def test_the_ratio_pairs_each_hooked_run_with_its_unhooked_neighbours() -> None:
    def run(hook: bool, median: float) -> RunResult:
        return RunResult(hook, [median], [0.1, 0.3] if hook else [], 2 if hook else 0, 1.0, [0.001] if hook else [])

    # A B A B A: the second A run drifted; each B is compared with the A runs on either side of it
    got = summarize([run(False, 1.0), run(True, 1.05), run(False, 1.1), run(True, 1.1), run(False, 1.1)])
    assert got["pair_ratios"] == pytest.approx([1.05 / 1.05, 1.1 / 1.1])
    assert got["ratio"] == pytest.approx(1.0) and got["ratio_ci"] == pytest.approx([1.0, 1.0])
    assert got["bubble_prediction_error_median"] == pytest.approx(0.2) and got["bubbles_announced"] == 4
    assert got["hook_own_s_median"] == 0.001 and got["hook_own_share"] == pytest.approx(0.001 / 1.075)
