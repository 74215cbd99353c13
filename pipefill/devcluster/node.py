"""One real node beside kwok's simulated ones: containerd, runc and the kubelet, on loopback, for the pods that must
really run (``pipefill cluster up --kubelet``, ``make cluster-node``).

It registers as ``127.0.1.10``, tainted (``pipefill.io/real-node``), with the CPUs and memory it really has and no
GPU. Pods meant for it tolerate the taint, select the label, use ``hostNetwork`` (the CNI network is loopback only)
and images already in its containerd (``imagePullPolicy: Never``; nothing is pulled). Its sandbox image is our own
pause program. :func:`stop` leaves no process, mount, cgroup or changed sysctl behind, whatever state the node is in;
:func:`leftovers` lists any, for the tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipefill.devcluster import bins, host, nodeconf, oci
from pipefill.devcluster.nodeconf import NODE_IP, PAUSE_IMAGE, NodePaths
from pipefill.devcluster.procs import Proc, StartFailed, free_port, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipefill.devcluster.cluster import ControlPlane

__all__ = [
    "NODE_IP",
    "PAUSE_IMAGE",
    "NodeUnavailable",
    "RealNode",
    "leftovers",
    "running",
    "snapshot",
    "start",
    "stop",
]

_MAX_SOCKET_PATH = 107
_VAR_LOG_CONTAINERS = Path("/var/log/containers")  # the kubelet links every container's log here, whatever its dirs
# The kubelet refuses to report a loopback address as its node's ("nodeIP can't be loopback address") and then reports
# none; set here, in the node's status, it stays (the kubelet's status patches leave fields it did not set alone).
# Pods then get it as hostIP (and podIP with hostNetwork), and the API server reaches the kubelet there (logs, exec).
_ADDRESSES = {
    "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": NODE_IP}]}
}


class NodeUnavailable(RuntimeError):
    """A real node cannot run on this machine (not root, no cgroups); the message says what is missing."""


@dataclass
class RealNode:
    name: str
    paths: NodePaths
    processes: list[Proc] = field(default_factory=list)

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``ctr`` against the node's containerd, in the namespace the kubelet uses."""
        argv = [str(bins.binary("ctr")), f"--address={self.paths.socket}", "-n", "k8s.io", *args]
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)

    def import_image(self, archive: Path) -> None:
        """Put an OCI image archive into the node's containerd (pods then use it with ``imagePullPolicy: Never``)."""
        proc = self.ctr("images", "import", str(archive))
        if proc.returncode != 0:
            raise StartFailed(f"ctr images import {archive} failed: {proc.stderr.strip()}")


def _load(paths: NodePaths) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(paths.state_file.read_text())
    except (OSError, ValueError):
        return {}
    return state


def _save(paths: NodePaths, state: dict[str, Any]) -> None:
    paths.state_file.write_text(json.dumps(state, indent=1))


def _binding() -> dict[str, Any]:
    """The node's identity gets the kubelet's permissions (``system:node``, which no group is bound to by default)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "pipefill-devcluster-node"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": f"system:node:{NODE_IP}"}],
    }


def _env(*dirs: Path) -> dict[str, str]:
    """Our binaries first, then /usr/bin and /bin only: without /usr/sbin the kubelet finds no ``iptables`` and adds
    no chains to the host's firewall (it needs none: no pod network, no Services)."""
    return {"PATH": ":".join([*(str(d) for d in dirs), "/usr/bin", "/bin"]), "HOME": "/root", "LANG": "C.UTF-8"}


def _ready(cp: ControlPlane) -> bool:
    proc = cp.kubectl("get", "node", NODE_IP, "-o", "json", check=False)
    if proc.returncode != 0:
        return False
    conditions = json.loads(proc.stdout)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def start(cp: ControlPlane, *, detach: bool, log: Callable[[str], None] = lambda _line: None) -> RealNode:
    """Start the node on ``cp`` (the binaries must be built: ``make cluster-bins``) and wait until it is Ready."""
    if os.geteuid() != 0:
        raise NodeUnavailable("a real node needs root (containerd and runc mount filesystems and make cgroups)")
    paths = NodePaths.of(cp.root)
    # The kubelet binds its pod-resources socket under its root directory (a temporary name of 10 digits first); a
    # unix socket's path must fit in 107 bytes.
    socket = paths.root / "kubelet" / "pod-resources" / "0123456789"
    if len(str(socket)) > _MAX_SOCKET_PATH:
        raise NodeUnavailable(
            f"the cluster's directory {cp.root} is too long for a real node: the kubelet's socket {socket} would be "
            f"{len(str(socket))} bytes, over the {_MAX_SOCKET_PATH} a unix socket allows; use a shorter --dir"
        )
    stop(cp.root)  # whatever a killed earlier run left behind
    binaries = {name: bins.binary(name) for name in ("kubelet", "containerd", "ctr", "loopback", "runc", "pause")}
    shutil.rmtree(paths.root, ignore_errors=True)
    paths.logs.mkdir(parents=True)
    paths.run.mkdir(parents=True, exist_ok=True)
    # Recorded before anything runs: down restores exactly these.
    state: dict[str, Any] = {**snapshot(), "processes": []}
    _save(paths, state)
    node = RealNode(NODE_IP, paths)

    def spawn(name: str, argv: list[str], env: dict[str, str]) -> Proc:
        proc = Proc.spawn(name, argv, paths.logs / f"{name}.log", detach=detach, env=env)
        node.processes.append(proc)
        state["processes"] = [p.to_json() for p in node.processes]
        _save(paths, state)
        return proc

    try:
        host.make_cgroup(paths.cgroup)
        nodeconf.write_configs(
            paths,
            runc=binaries["runc"],
            cni_bin=binaries["loopback"].parent,
            ca=cp.root / "pki" / "ca.crt",
            port=free_port(),
            healthz_port=free_port(),
        )
        archive = paths.root / "images" / "pause.tar"
        oci.write_image_archive(archive, name=PAUSE_IMAGE, files={"/pause": binaries["pause"]}, entrypoint=["/pause"])
        env = _env(binaries["containerd"].parent, binaries["runc"].parent)
        containerd = spawn("containerd", nodeconf.containerd_argv(binaries["containerd"], paths), env)
        wait_until("containerd", lambda: node.ctr("version").returncode == 0, timeout_s=60, proc=containerd)
        node.import_image(archive)
        log(f"containerd ready, pause image imported ({PAUSE_IMAGE})")
        cp.apply([_binding()])
        kubelet_argv = nodeconf.kubelet_argv(binaries["kubelet"], paths, kubeconfig=cp.root / "kubelet.kubeconfig")
        kubelet = spawn("kubelet", kubelet_argv, env)
        registered = lambda: cp.kubectl("get", "node", NODE_IP, check=False).returncode == 0  # noqa: E731
        wait_until(f"node {NODE_IP} registered", registered, timeout_s=120, proc=kubelet)
        patch = json.dumps(_ADDRESSES)
        cp.kubectl("patch", "node", NODE_IP, "--subresource=status", "--type=merge", f"--patch={patch}")
        wait_until(f"node {NODE_IP} Ready", lambda: _ready(cp), timeout_s=120, proc=kubelet)
        log(f"real node {NODE_IP} Ready (kubelet, containerd, runc; logs in {paths.logs})")
    except BaseException:
        stop(cp.root)
        raise
    return node


def running(cluster_root: Path) -> RealNode | None:
    """The node of the cluster in ``cluster_root`` if its containerd and kubelet both still run."""
    paths = NodePaths.of(cluster_root)
    procs = [Proc.from_json(d) for d in _load(paths).get("processes", [])]
    if len(procs) != 2 or not all(p.running() for p in procs):
        return None
    return RealNode(NODE_IP, paths, procs)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def stop(cluster_root: Path) -> list[str]:
    """Stop the node of the cluster in ``cluster_root`` and undo what it did to the host; returns what was undone
    (empty when there was nothing). Safe to call on a node that never started, half started or was killed."""
    paths = NodePaths.of(cluster_root)
    state = _load(paths)
    done: list[str] = []
    procs = {p.name: p for p in (Proc.from_json(d) for d in state.get("processes", []))}
    if "kubelet" in procs and procs["kubelet"].running():
        procs["kubelet"].stop()
        done.append("kubelet stopped")
    if killed := host.kill_cgroup(paths.cgroup):  # the pods' processes, before the runtime that would restart them
        done.append(f"{killed} container processes killed")
    if "containerd" in procs and procs["containerd"].running():
        procs["containerd"].stop()
        done.append("containerd stopped")
    for _ in range(50):  # the shims, found by the socket they were given
        if not (shims := host.processes_mentioning(str(paths.run))):
            break
        _kill(shims)
        done.append(f"{len(shims)} shims killed")
        wait_until("the shims to exit", lambda: not host.processes_mentioning(str(paths.run)), timeout_s=10)
    if unmounted := host.unmount_under(paths.root, paths.run):
        done.append(f"{unmounted} mounts unmounted")
    host.remove_cgroup(paths.cgroup)
    if restored := host.restore_sysctls(state.get("sysctls", {})):
        done.append(f"sysctls restored: {', '.join(restored)}")
    _unlink_logs(paths)
    for path, existed in state.get("paths", {}).items():
        if not existed and os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"{path} removed")
    shutil.rmtree(paths.run, ignore_errors=True)
    paths.state_file.unlink(missing_ok=True)
    return done


def _unlink_logs(paths: NodePaths) -> None:
    """The kubelet's links in /var/log/containers to the node's container logs."""
    if not _VAR_LOG_CONTAINERS.is_dir():
        return
    for link in _VAR_LOG_CONTAINERS.iterdir():
        if link.is_symlink() and os.readlink(link).startswith(str(paths.root)):
            link.unlink()


def snapshot() -> dict[str, Any]:
    """What :func:`stop` restores: the kubelet's sysctls, and which of the paths it creates existed."""
    return {"sysctls": host.read_sysctls(), "paths": {p: os.path.lexists(p) for p in host.CREATED_PATHS}}


def leftovers(cluster_root: Path, *, before: dict[str, Any]) -> list[str]:
    """What of the node is still on the host compared with ``before`` (a :func:`snapshot`): processes, mounts,
    cgroups, changed sysctls, created paths, links in /var/log/containers, the socket directory. Empty after
    :func:`stop`."""
    paths = NodePaths.of(cluster_root)
    found = [f"process {pid}" for pid in host.processes_mentioning(str(paths.run), str(paths.root))]
    found += [f"mount {point}" for point in host.mounts_under(paths.root, paths.run)]
    found += [f"cgroup {d}" for d in host.cgroup_dirs(paths.cgroup)]
    now = host.read_sysctls()
    found += [f"sysctl {k}={now[k]} (was {v})" for k, v in before["sysctls"].items() if now[k] != v]
    found += [f"path {p}" for p, existed in before["paths"].items() if not existed and os.path.lexists(p)]
    if _VAR_LOG_CONTAINERS.is_dir():
        found += [f"link {link}" for link in _VAR_LOG_CONTAINERS.iterdir() if str(paths.root) in os.readlink(link)]
    if paths.run.exists():
        found.append(f"directory {paths.run}")
    return found
