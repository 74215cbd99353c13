"""The trainer benchmark still runs end to end (a tiny configuration; speed is never asserted in tests)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# busy, not alone: its two ranks are pinned one per core, but nothing timed is asserted, and alone it left the other
# worker idle for its 26 s while it kept 1.4 cores busy (tests/sharing.py)
pytestmark = [pytest.mark.busy, pytest.mark.slow]


def test_bench_trainer_prints_its_json_keys() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipefill",
            "bench",
            "trainer",
            "--json",
            "--blocks",
            "1",
            "--steps-per-block",
            "4",
            "--layers",
            "2",
            "--hidden",
            "32",
            "--seq",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"ours_step_s", "torch_step_s", "ratio", "bubble_prediction_error_median"} <= set(result)
    assert result["ours_step_s"] > 0 and result["torch_step_s"] > 0
