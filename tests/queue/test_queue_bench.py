"""``pipefill bench scheduler`` runs from the command line and prints its one JSON object (speed is not tested)."""

from __future__ import annotations

import json
import subprocess
import sys

from pipefill.queue import POLICIES


def test_bench_scheduler_prints_every_policy() -> None:
    args = ["bench", "scheduler", "--json", "--repeats", "2", "--training-jobs", "6", "--fill-jobs", "60"]
    out = subprocess.run(
        [sys.executable, "-m", "pipefill", *args], capture_output=True, text=True, check=True, timeout=60
    )
    result = json.loads(out.stdout)
    assert sorted(result["policies"]) == sorted(POLICIES)
    for figures in result["policies"].values():
        assert 0 < figures["pass_ms"]["p50"] <= figures["pass_ms"]["p99"]
        assert figures["assignments"] > 0
    assert result["snapshot"]["ranks"] == 48 and result["snapshot"]["fill_jobs"] == 60


def test_bench_scheduler_refuses_bad_sizes() -> None:
    args = ["bench", "scheduler", "--json", "--fill-jobs", "0"]
    out = subprocess.run([sys.executable, "-m", "pipefill", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--fill-jobs: 0 must be ≥ 1" in out.stderr
