"""The real node's files: the kubelet's configuration, containerd's, the loopback-only CNI network, the command lines.

Every path the node writes is under its own directories: ``<cluster>/node`` for state and logs, and a short
directory under /run for the sockets (a unix socket's path must fit in 108 bytes; containerd allows its shims' socket
directory 38 characters). Nothing listens beyond the node's own loopback address. Why each setting is what it is:
docs/cluster.md ("A real node").
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "NODE_IP",
    "NODE_LABEL",
    "PAUSE_IMAGE",
    "POD_PLACEMENT",
    "TAINT",
    "NodePaths",
    "cni_conflist",
    "containerd_argv",
    "containerd_config",
    "kubelet_argv",
    "kubelet_config",
    "write_configs",
]

# The kubelet refuses a loopback node IP such as 127.0.0.1 but takes another 127.x address. kwok's simulated nodes
# use 127.0.2.N and up, their pods 127.1.0.0/16: 127.0.1.x is nobody's.
NODE_IP = "127.0.1.10"
NODE_LABEL = "pipefill.io/real-node"
# Tainted, so that only pods meant for it (tolerating the taint) land on it and kwok's nodes serve everything else.
TAINT = {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"}
PAUSE_IMAGE = "pipefill.local/pause:1"
# What a pod spec needs to run on the real node: tolerate its taint, select it, and use the host's network (the CNI
# network is loopback only: a pod network namespace would get no address, and the CRI refuses to start it).
POD_PLACEMENT: dict[str, Any] = {
    "nodeSelector": {NODE_LABEL: "true"},
    "tolerations": [{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
    "hostNetwork": True,
}


@dataclass(frozen=True)
class NodePaths:
    """Where one node keeps what: ``root`` under the cluster's directory, ``run`` short, under /run."""

    root: Path
    run: Path

    @classmethod
    def of(cls, cluster_root: Path) -> NodePaths:
        tag = hashlib.sha256(str(cluster_root.resolve()).encode()).hexdigest()[:8]
        return cls(cluster_root.resolve() / "node", Path("/run") / f"pipefill-{tag}")

    @property
    def cgroup(self) -> str:
        """The kubelet's cgroup root (``/pipefill-<tag>``): the node's pods, and nothing else, live under it."""
        return "/" + self.run.name

    @property
    def socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


def cni_conflist() -> dict[str, Any]:
    """A network of the loopback plugin alone: the CRI reports the network ready, pods use ``hostNetwork``."""
    return {"cniVersion": "1.0.0", "name": "pipefill-loopback", "plugins": [{"type": "loopback"}]}


def containerd_config(paths: NodePaths, *, runc: Path, cni_bin: Path) -> str:
    """containerd's config.toml (version 3). Plugins that would touch paths outside ours are disabled."""
    p = paths.root / "containerd"
    return f"""\
version = 3
root = "{p / "root"}"
state = "{paths.run / "state"}"
temp = "{p / "tmp"}"
# The NRI socket is under /var/run, the opt plugin installs into /opt: neither is needed; no btrfs, zfs, devmapper.
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
address = "{paths.socket}"

[ttrpc]
address = "{paths.run / "containerd.sock.ttrpc"}"

[debug]
address = ""
level = "warn"

[metrics]
address = ""

[plugins."io.containerd.shim.v1.manager"]
socket_dir = "{paths.run / "s"}"

[plugins."io.containerd.grpc.v1.cri"]
stream_server_address = "127.0.0.1"
stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
# The machine lacks CAP_SYS_RESOURCE: lowering a container's oom_score_adj below containerd's own fails.
restrict_oom_score_adj = true
enable_cdi = false
cdi_spec_dirs = []

[plugins."io.containerd.cri.v1.runtime".cni]
bin_dirs = ["{cni_bin}"]
conf_dir = "{p / "cni"}"

[plugins."io.containerd.cri.v1.runtime".containerd]
default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
BinaryName = "{runc}"
Root = "{paths.run / "runc"}"
SystemdCgroup = false
"""


def containerd_argv(binary: Path, paths: NodePaths) -> list[str]:
    return [str(binary), f"--config={paths.root / 'containerd' / 'config.toml'}"]


def kubelet_config(paths: NodePaths, *, ca: Path, port: int, healthz_port: int) -> dict[str, Any]:
    """The KubeletConfiguration: on the node's address only, cgroupfs under our own cgroup root, no read-only port."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": NODE_IP,
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "cgroupDriver": "cgroupfs",  # no systemd here
        "cgroupRoot": paths.cgroup,
        "failCgroupV1": False,  # this machine's kind runs cgroup v1; Kubernetes 1.35+ refuses it unless told
        "failSwapOn": False,
        "podLogsDir": str(paths.root / "pod-logs"),
        "volumePluginDir": str(paths.root / "volume-plugins"),  # default: /usr/libexec/kubernetes/…
        "registerWithTaints": [TAINT],
        "maxPods": 32,
        "clusterDomain": "cluster.local",
        "rotateCertificates": False,
        "serializeImagePulls": False,
        # The disk is shared with everything else on the machine: evict only when it is really full.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%"},
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
        "fileCheckFrequency": "0s",
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",
    }


def kubelet_argv(binary: Path, paths: NodePaths, *, kubeconfig: Path) -> list[str]:
    return [
        str(binary),
        f"--config={paths.root / 'kubelet.yaml'}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={paths.root / 'kubelet'}",
        f"--cert-dir={paths.root / 'kubelet' / 'pki'}",
        f"--hostname-override={NODE_IP}",
        f"--node-ip={NODE_IP}",
        f"--node-labels={NODE_LABEL}=true",
        "--v=1",
    ]


def write_configs(paths: NodePaths, *, runc: Path, cni_bin: Path, ca: Path, port: int, healthz_port: int) -> None:
    """Write the three files into the node's directory."""
    cni = paths.root / "containerd" / "cni"
    cni.mkdir(parents=True, exist_ok=True)
    (cni / "10-loopback.conflist").write_text(json.dumps(cni_conflist(), indent=1))
    (paths.root / "containerd" / "config.toml").write_text(containerd_config(paths, runc=runc, cni_bin=cni_bin))
    config = kubelet_config(paths, ca=ca, port=port, healthz_port=healthz_port)
    (paths.root / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
