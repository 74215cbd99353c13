"""The control plane itself: everything on loopback, `pipefill cluster up/down` (what `make cluster` runs), audit log
and per-identity kubeconfigs."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipefill.devcluster import ControlPlane, kubectl_binary
from pipefill.devcluster.procs import Proc

pytestmark = pytest.mark.cluster


def _listening_addresses(pids: list[int]) -> set[str]:
    """Local addresses of every TCP socket the processes ``pids`` listen on (from /proc, no tools needed)."""
    inodes: set[str] = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found: set[str] = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(cols[1].split(":")[0])
            if width == 4:
                found.add(str(ipaddress.IPv4Address(raw[::-1])))
            else:
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                found.add(str(ipaddress.IPv6Address(words)))
    return found


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return (mapped or ip).is_loopback


def test_every_component_listens_on_loopback_only(control_plane: ControlPlane) -> None:
    addresses = _listening_addresses([p.pid for p in control_plane.processes])
    assert addresses, "found no listening socket at all"
    assert all(_is_loopback(a) for a in addresses), addresses


def test_nodes_and_pods_get_loopback_addresses(control_plane: ControlPlane, namespace: str) -> None:
    nodes = json.loads(control_plane.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert len(nodes) == control_plane.nodes
    for node in nodes:
        assert all(_is_loopback(a["address"]) for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    control_plane.kubectl("run", "probe", "-n", namespace, "--image=busybox", "--restart=Never")
    control_plane.kubectl("wait", "-n", namespace, "--for=condition=Ready", "pod/probe", "--timeout=60s")
    pod = json.loads(control_plane.kubectl("get", "pod", "probe", "-n", namespace, "-o", "json").stdout)
    assert _is_loopback(pod["status"]["podIP"]) and _is_loopback(pod["status"]["hostIP"])
    service = json.loads(control_plane.kubectl("get", "service", "kubernetes", "-n", "default", "-o", "json").stdout)
    assert _is_loopback(service["spec"]["clusterIP"])


def test_service_account_kubeconfig_is_that_identity_and_audited(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    kubeconfig = control_plane.kubeconfig_for(namespace, "reader")
    denied = subprocess.run(
        [kubectl_binary(), f"--kubeconfig={kubeconfig}", "get", "pods", "-n", namespace],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert denied.returncode != 0 and "forbidden" in denied.stderr
    assert f"system:serviceaccount:{namespace}:reader" in denied.stderr
    user = f"system:serviceaccount:{namespace}:reader"
    events = [e for e in control_plane.audit_events() if e["user"]["username"] == user]
    assert any(
        e["verb"] == "list" and e["objectRef"]["resource"] == "pods" and e["responseStatus"]["code"] == 403
        for e in events
    )


def test_the_audit_log_is_read_up_to_its_last_whole_line(tmp_path: Path) -> None:
    """The API server appends the audit log as it goes: a read can end in the middle of a line (CI, session 32)."""
    log = tmp_path / "audit.log"
    cp = ControlPlane(tmp_path, "https://127.0.0.1:1", tmp_path / "admin.kubeconfig", log, nodes=0)
    assert cp.audit_events() == []  # none written yet
    whole = [{"auditID": "a", "verb": "list"}, {"auditID": "b", "verb": "watch"}]
    log.write_text("".join(json.dumps(e) + "\n" for e in whole) + '{"kind":"Event","apiVersion"')
    assert cp.audit_events() == whole
    with log.open("a") as f:
        f.write(':"audit.k8s.io/v1","auditID":"c"}\n')
    assert [e["auditID"] for e in cp.audit_events()] == ["a", "b", "c"]


def _cli(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pipefill", "cluster", *args, "--dir", str(root), "--nodes", "2"]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=110)


@pytest.mark.timeout(300)
def test_cluster_up_twice_then_down_leaves_no_process(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    first = _cli("up", root=root)
    assert first.returncode == 0, first.stderr
    line = first.stdout.strip().splitlines()[-1]
    assert line == f"export KUBECONFIG={root / 'admin.kubeconfig'}"
    running = ControlPlane.running(root)
    assert running is not None
    pids = [p.pid for p in running.processes]
    try:
        assert "kwok-node-1" in running.kubectl("get", "nodes").stdout
        assert "pipelinetrainingjobs.pipefill.io" in running.kubectl("get", "crd").stdout
        second = _cli("up", root=root)
        assert second.returncode == 0 and "already runs" in second.stderr
        assert second.stdout.strip().splitlines()[-1] == line
    finally:
        down = _cli("down", root=root)
    assert down.returncode == 0, down.stderr
    assert not any(Proc(p.name, p.pid, p.started, p.log).running() for p in running.processes), pids
    assert _cli("status", root=root).returncode == 1


@pytest.mark.timeout(200)
def test_bench_cluster_reports_every_phase() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pipefill", "bench", "cluster", "--reps", "1", "--nodes", "1", "--json"],
        capture_output=True, text=True, check=False, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    phases = result["seconds_to"]
    assert list(phases) == ["etcd", "kube-apiserver", "controller-manager", "nodes", "ready", "stop"]
    assert 0 < phases["etcd"]["median"] <= phases["kube-apiserver"]["median"] <= phases["ready"]["median"]
