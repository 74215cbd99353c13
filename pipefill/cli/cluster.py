"""Build, start and stop the local control plane (``make cluster-bins``, ``make cluster``, ``make cluster-down``).

``pipefill cluster up`` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok with simulated
GPU nodes on loopback, in the background, applies the CRDs, and prints ``export KUBECONFIG=<path>`` as its last line.
A second ``up`` while one runs says so and prints the same line. ``down`` stops every process it started.

``up --kubelet`` adds one real node (kubelet, containerd, runc; ``make cluster-node``), to a running control plane
too; ``down`` then also undoes what the node changed on the host (mounts, cgroups, sysctls). Root only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]

_DEFAULT_DIR = Path(".cluster")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["bins", "up", "down", "status"], help="what to do")
    parser.add_argument("--dir", type=Path, default=_DEFAULT_DIR, help="state directory (default: .cluster)")
    parser.add_argument("--nodes", type=int, default=4, help="kwok GPU nodes; the last one is tainted (default 4)")
    parser.add_argument(
        "--kubelet",
        action="store_true",
        help="up: one real node too (kubelet, containerd, runc on 127.0.1.10, tainted pipefill.io/real-node; root only)",
    )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from pipefill.devcluster import BinaryMissing, ControlPlane, StartFailed, ensure_built, start
    from pipefill.devcluster.bins import CONTROL_PLANE, NODE
    from pipefill.devcluster.node import NodeUnavailable

    root: Path = args.dir.resolve()
    if args.nodes < 1:
        _say(f"error: --nodes {args.nodes}: a cluster needs at least one node; use --nodes 1 or more")
        return 2
    try:
        if args.action == "bins":
            ensure_built(log=_say)
            return 0
        running = ControlPlane.running(root)
        if args.action == "status":
            print(("running, with a real node" if running.real_node else "running") if running else "stopped")
            return 0 if running else 1
        if args.action == "down":
            if running is None:
                ControlPlane(root, "", root / "admin.kubeconfig", root / "audit.log", 0).stop()  # leftovers, if any
                _say(f"no control plane runs in {root}")
            else:
                running.stop()
                _say(f"control plane in {root} stopped")
            return 0
        needed = tuple(m for m in CONTROL_PLANE if m != "helm") + (NODE if args.kubelet else ())
        if running is not None:
            _say(f"a control plane already runs in {root} ({running.server}); `make cluster-down` stops it")
            if args.kubelet and running.real_node is None:
                ensure_built(NODE, log=_say)
                running.add_node(detach=True, log=_say)
        else:
            ensure_built(needed, log=_say)
            _say(f"starting the control plane in {root} …")
            running = start(root, nodes=args.nodes, detach=True, real_node=args.kubelet, log=_say)
            _say(f"{running.nodes} kwok GPU nodes; pods never run their images there (no kubelet)")
        if running.real_node is not None:
            _say(
                f"a real node, {running.real_node.name}: pods that tolerate the taint pipefill.io/real-node, select the "
                "label pipefill.io/real-node=true and use hostNetwork run there, with images in its containerd"
            )
        print(f"export KUBECONFIG={running.kubeconfig}")
        return 0
    except (BinaryMissing, StartFailed, NodeUnavailable) as exc:
        _say(f"error: {exc}")
        return 1
