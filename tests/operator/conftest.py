"""Fixtures of the operator's cluster tests: its identity (a ServiceAccount bound to the committed ClusterRole), the
test's own API client, and the operator as a process serving the test's namespace."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from operator_harness import Kube, OperatorProcess, committed_role, install_identity

from pipefill.devcluster import ControlPlane

OPERATOR_SA = "pipefill-operator"


@pytest.fixture(scope="session")
def operator_kubeconfig(control_plane: ControlPlane) -> Path:
    """Credentials of ``pipefill-system/pipefill-operator``, bound to operator/rbac/clusterrole.yaml only."""
    return install_identity(control_plane, OPERATOR_SA, committed_role())


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Kube:
    return Kube(control_plane)


@pytest.fixture
def start_operator(
    operator_kubeconfig: Path, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    """Start an operator serving the test's namespace (``clusterwide=True``: all of them); stopped afterwards."""
    started: list[OperatorProcess] = []

    def start(*, clusterwide: bool = False, status_interval_s: float = 1.0) -> OperatorProcess:
        namespaces = () if clusterwide else (namespace,)
        proc = OperatorProcess(
            operator_kubeconfig, tmp_path / f"operator-{len(started)}.log", namespaces=namespaces,
            status_interval_s=status_interval_s,
        )  # fmt: skip
        proc.start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
