"""The real node: `pipefill cluster up --kubelet` starts a kubelet, containerd and runc beside kwok's nodes; a pod
really runs there (a native sidecar, a memory emptyDir, a main container that exits 3); `down` leaves nothing on the
host. Needs root and the node's binaries (`make cluster-bins`, which `make test` runs first): without them the test
skips with the reason, except with CI=true, where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_for

from pipefill.devcluster import BinaryMissing, ControlPlane, bins, host, node
from pipefill.devcluster.nodeconf import NODE_LABEL, POD_PLACEMENT, NodePaths

pytestmark = [pytest.mark.busy, pytest.mark.cluster, pytest.mark.node]  # heavy, untimed (tests/sharing.py)

_IN_CI = os.environ.get("CI", "").lower() == "true"


def _need_node() -> None:
    missing = ""
    if os.geteuid() != 0:
        missing = "a real node needs root"
    else:
        try:
            for name in ("kubelet", "containerd", "runc", "pause", "etcd", "kube-apiserver", "kwok"):
                bins.binary(name)
        except BinaryMissing as exc:
            missing = str(exc)
    if missing and _IN_CI:
        pytest.fail(f"CI=true and the real node cannot run: {missing}", pytrace=False)
    if missing:
        pytest.skip(missing)


def _cli(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pipefill", "cluster", *args, "--dir", str(root), "--nodes", "2"]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=150)


def _pod(name: str) -> dict[str, Any]:
    """A sidecar that runs until stopped and a main container that exits 3, sharing a memory emptyDir."""
    mounts = [{"name": "channel", "mountPath": "/channel"}]
    image = {"image": node.PAUSE_IMAGE, "imagePullPolicy": "Never", "volumeMounts": mounts}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            **POD_PLACEMENT,
            "restartPolicy": "Never",
            "volumes": [{"name": "channel", "emptyDir": {"medium": "Memory"}}],
            "initContainers": [{"name": "sidecar", "restartPolicy": "Always", **image}],
            "containers": [{"name": "main", "command": ["/pause", "exit", "3"], **image}],
        },
    }


def _wait_pod(cp: ControlPlane, name: str, phases: tuple[str, ...], timeout_s: float = 90) -> dict[str, Any]:
    def pod() -> dict[str, Any]:
        got: dict[str, Any] = json.loads(cp.kubectl("get", "pod", name, "-o", "json").stdout)
        return got

    return wait_for(pod, f"pod {name} in {phases}", timeout_s, 0.2, until=lambda p: p["status"].get("phase") in phases)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A cluster directory with a short path: the kubelet's unix sockets live under it (pytest's own tmp_path can be
    too long for them)."""
    path = Path(tempfile.mkdtemp(prefix="pf-node-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(400)
def test_cluster_up_kubelet_runs_a_pod_for_real_and_down_leaves_nothing(short_dir: Path) -> None:
    _need_node()
    before = node.snapshot()
    root = short_dir / "cluster"
    up = _cli("up", "--kubelet", root=root)
    try:
        assert up.returncode == 0, up.stderr
        cp = ControlPlane.running(root)
        assert cp is not None and cp.real_node is not None, up.stderr
        assert _cli("status", root=root).stdout.strip() == "running, with a real node"
        real = json.loads(cp.kubectl("get", "node", node.NODE_IP, "-o", "json").stdout)
        assert {"type": "InternalIP", "address": node.NODE_IP} in real["status"]["addresses"]
        assert [t["key"] for t in real["spec"]["taints"]] == [NODE_LABEL]
        assert real["status"]["capacity"]["cpu"] == str(os.cpu_count())  # what it has; no GPU here
        assert "nvidia.com/gpu" not in real["status"]["capacity"]

        cp.apply([_pod("exit-3")])
        pod = _wait_pod(cp, "exit-3", ("Succeeded", "Failed"))
        assert pod["status"]["phase"] == "Failed" and pod["spec"]["nodeName"] == node.NODE_IP
        main = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert main["exitCode"] == 3, main
        assert pod["status"]["initContainerStatuses"][0]["containerID"].startswith("containerd://")
        assert cp.kubectl("logs", "exit-3", "-c", "main").stdout == "exit 3\n"  # through the kubelet's server
        # Mounts, cgroups and processes exist while it runs, so that finding none after `down` means something.
        assert host.mounts_under(NodePaths.of(root).root) and host.cgroup_dirs(NodePaths.of(root).cgroup)

        # Without the toleration a pod lands on a kwok node (the first of the two is untainted), never on the real one.
        cp.kubectl("run", "elsewhere", "--image=busybox", "--restart=Never")
        assert _wait_pod(cp, "elsewhere", ("Running",))["spec"]["nodeName"].startswith("kwok-node-")
    finally:
        down = _cli("down", root=root)
    assert down.returncode == 0, down.stderr
    assert node.leftovers(root, before=before) == []
    assert _cli("status", root=root).returncode == 1
