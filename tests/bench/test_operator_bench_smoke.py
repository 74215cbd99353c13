"""``pipefill bench operator`` end to end on a tiny cluster: its JSON says every job ran, and it removes the control
plane's directory afterwards (unless --keep). Benchmarks are not tests: nothing here asserts on speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipefill.devcluster import ControlPlane

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(300)
def test_a_small_run_reports_every_job_running_and_leaves_no_directory(
    control_plane: ControlPlane,  # the gate: a control plane can start here (else the test skips, or fails in CI)
    tmp_path: Path,
) -> None:
    del control_plane
    args = ["--nodes", "2", "--jobs", "2", "--ranks", "2", "--timeout", "120", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "pipefill", "bench", "operator", *args],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["all_running"] and result["jobs_running"] == 2 and result["pods"] == 4
    assert result["reconciles"] > 0 and result["operator_peak_rss_mib"] > 0
    assert not list(tmp_path.glob("pipefill-bench-operator-*")), "the control plane's directory was left behind"
