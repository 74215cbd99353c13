"""Fixtures of the chart's tests: the real helm, and a control plane of their own.

The chart installs cluster-scoped objects (its CRDs among them) and its tests delete the CRDs to install them from
scratch, which would take every other test's jobs with them; so these tests get a control plane of their own
instead of the session's shared one. With ``CI=true`` a missing helm or a failed start fails, as for the shared one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipefill.devcluster import BinaryMissing, ControlPlane, StartFailed, start

# The operator tests' harness: its Kube client with event-driven waits, job manifests, the operator process.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from chart_harness import helm_binary

_IN_CI = os.environ.get("CI", "").lower() == "true"


def _unavailable(reason: str) -> None:
    if _IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def helm_built() -> None:
    """Every chart test needs the real helm."""
    try:
        helm_binary()
    except BinaryMissing as exc:
        _unavailable(f"no helm: {exc}")


@pytest.fixture(scope="module")  # one file uses it: stopped after it, not left idle (3 CPU s a minute) to the end
def chart_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        cp = start(tmp_path_factory.mktemp("chart-control-plane"), nodes=2)
    except (BinaryMissing, StartFailed) as exc:
        _unavailable(f"the control plane cannot start: {exc}")
        raise  # unreachable: _unavailable raises
    try:
        yield cp
    finally:
        cp.stop()
