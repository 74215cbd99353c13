"""``pipefill bench fill`` end to end on one core: a synthetic trainer and the fill executor as real processes.
Benchmarks are not tests: only the result's shape and sense are checked, never its speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.timeout(110)
def test_bench_fill_measures_a_bubble_length_from_the_event_log() -> None:
    cpu = str(min(os.sched_getaffinity(0)))
    done = subprocess.run(
        [sys.executable, "-m", "pipefill", "bench", "fill", "--json", "--bubbles-ms", "30", "--seconds", "8",
         "--layers", "1", "--hidden", "32", "--seq-len", "16", "--cpu", cpu],
        capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    (run,) = out["runs"]
    assert run["bubble_ms"] == 30 and run["fill_exit_code"] == 0
    assert run["bubbles"] > 0 and 0 <= run["bubbles_used"] <= run["bubbles"]
    assert 0 <= run["recovery"] <= 1.05 and run["samples"] >= 0
