"""Files the control plane reads: kubeconfigs, the audit policy, and each component's command line.

Every component listens on 127.0.0.1 on a port chosen free at start (the controller-manager's and scheduler's fixed
default ports are overridden), so several clusters (a test session and `make cluster`) run side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["FEATURE_GATES", "RUNTIME_CONFIG", "SERVICE_CIDR", "Ports", "component_argv", "write_kubeconfig"]

# A loopback range: no address of the test cluster, virtual or not, leaves this machine.
SERVICE_CIDR = "127.96.0.0/16"
SERVICE_IP = "127.96.0.1"  # the ``kubernetes`` Service: the first address of SERVICE_CIDR
# Kubernetes 1.36's own gang scheduling (alpha): Workload/PodGroup objects in scheduling.k8s.io/v1alpha2 and the
# scheduler's gang plugin. On here so the operator's use of it is tested for real.
FEATURE_GATES = "GenericWorkload=true,GangScheduling=true"
RUNTIME_CONFIG = "scheduling.k8s.io/v1alpha2=true"
SCHEDULER_QPS = 200
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    # Metadata: who did what to which object, without bodies; enough to count an actor's requests and derive RBAC.
    "rules": [{"level": "Metadata"}],
}


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


def write_kubeconfig(
    path: Path, *, server: str, ca: Path, user: str, cert: Path | None = None, key: Path | None = None, token: str = ""
) -> Path:
    """A kubeconfig with one cluster, one user (client certificate or bearer token) and a current context."""
    creds: dict[str, str] = {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "pipefill-dev", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": f"{user}@pipefill-dev", "context": {"cluster": "pipefill-dev", "user": user}}],
        "current-context": f"{user}@pipefill-dev",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


def component_argv(name: str, binary: Path, root: Path, ports: Ports, *, audit: bool) -> list[str]:
    """The command line of ``name`` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok)."""
    pki = root / "pki"
    if name == "etcd":
        peer = f"http://127.0.0.1:{ports.etcd_peer}"
        client = f"http://127.0.0.1:{ports.etcd_client}"
        return [
            str(binary),
            f"--data-dir={root / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--listen-metrics-urls=",
            "--unsafe-no-fsync",  # a test cluster: speed over durability across power loss
            "--log-level=warn",
        ]
    if name == "kube-apiserver":
        argv = [
            str(binary),
            f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            # Who the API server is to a kubelet (the real node's: logs, exec); kwok's nodes never see it.
            f"--kubelet-client-certificate={pki / 'kube-apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kube-apiserver-kubelet-client.key'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            f"--feature-gates={FEATURE_GATES}",
            f"--runtime-config={RUNTIME_CONFIG}",
            "--endpoint-reconciler-type=none",  # no endpoints for the `kubernetes` Service: nothing routes here
            "--v=1",
        ]
        if audit:
            argv += [
                f"--audit-policy-file={root / 'audit-policy.yaml'}",
                f"--audit-log-path={root / 'audit.log'}",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",
                "--audit-log-mode=blocking",  # events are on disk when the request returns: tests read them at once
            ]
        return argv
    common = [
        f"--kubeconfig={root / f'{name}.kubeconfig'}",
        f"--authentication-kubeconfig={root / f'{name}.kubeconfig'}",
        f"--authorization-kubeconfig={root / f'{name}.kubeconfig'}",
        "--bind-address=127.0.0.1",
        f"--cert-dir={root / name}",
        "--leader-elect=false",
        f"--feature-gates={FEATURE_GATES}",
        "--v=1",
    ]
    if name == "kube-controller-manager":
        return [
            str(binary),
            *common,
            f"--secure-port={ports.controller_manager}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--use-service-account-credentials=true",
            # kwok renews a simulated node's lease every 30 s (kwok.NODE_LEASE_S): a node is NotReady only after
            # a few missed renewals, not after one renewal late on a saturated machine
            "--node-monitor-grace-period=300s",
            # No pod CIDRs to hand out, no volumes to attach, no bootstrap tokens: leave those controllers out. And
            # no Endpoints/EndpointSlices: they refuse our loopback pod IPs and would retry with Warning Events, load
            # a real cluster does not have (nothing here routes to a Service anyway).
            "--controllers=*,-node-ipam-controller,-persistentvolume-attach-detach-controller,"
            "-bootstrap-signer-controller,-token-cleaner-controller,-endpoints-controller,-endpointslice-controller,"
            "-endpointslice-mirroring-controller",
        ]
    if name == "kube-scheduler":
        # Its client's rate as managed clusters of over 1 000 nodes set it (the default, 50 requests a second, binds
        # 8 000 rank pods in no less than 160 s: the operator benchmark's pods waited for it, not for the operator)
        return [
            str(binary),
            *common,
            f"--secure-port={ports.scheduler}",
            f"--kube-api-qps={SCHEDULER_QPS}",
            f"--kube-api-burst={2 * SCHEDULER_QPS}",
        ]
    if name == "kwok":
        return [str(binary), f"--kubeconfig={root / 'kwok.kubeconfig'}", f"--config={root / 'kwok.yaml'}"]
    raise ValueError(f"unknown component {name!r}")
