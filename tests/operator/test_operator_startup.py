"""An operator that starts before it may list what it serves (its ClusterRole bound a moment later, or CRDs not served
yet: both fail its first list) serves within seconds of the cause going away, not after kopf's default 60 s."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from operator_harness import OPERATOR_NAMESPACE, OperatorProcess, committed_role, install_identity
from waiting import wait_for

from pipefill.devcluster import ControlPlane

pytestmark = pytest.mark.cluster

NAME = "pipefill-late-role"  # its own ServiceAccount: the session's operator identity keeps its one binding


def test_an_operator_whose_first_list_is_forbidden_serves_seconds_after_its_role_is_bound(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    nothing = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "x"}}
    kubeconfig = install_identity(control_plane, NAME, {**nothing, "rules": []})
    operator = OperatorProcess(kubeconfig, tmp_path / "operator.log", namespaces=(namespace,))
    started = threading.Thread(target=operator.start, kwargs={"timeout_s": 120}, daemon=True)
    started.start()
    try:
        wait_for(lambda: "403" in operator.log_text(), "the operator's first list forbidden", 60)
        granted = {**committed_role(), "metadata": {"name": f"{NAME}-granted"}}
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{NAME}-granted"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{NAME}-granted"},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": OPERATOR_NAMESPACE}],
        }
        control_plane.apply([granted, binding])
        bound_at = time.monotonic()
        started.join(timeout=120)
        waited_s = time.monotonic() - bound_at
        assert operator.proc is not None and operator.proc.poll() is None, operator.log_text()[-3000:]
        assert waited_s < 20, f"served {waited_s:.1f} s after its role was bound"
    finally:
        operator.stop()
        for kind in ("clusterrolebinding", "clusterrole"):
            names = (NAME, f"{NAME}-granted") if kind == "clusterrolebinding" else (f"{NAME}-role", f"{NAME}-granted")
            control_plane.kubectl("delete", kind, *names, "--ignore-not-found", check=False)
        control_plane.kubectl(
            "delete", "serviceaccount", NAME, "-n", OPERATOR_NAMESPACE, "--ignore-not-found", check=False
        )
