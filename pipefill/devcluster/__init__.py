"""A real Kubernetes control plane on loopback for tests, benchmarks and trying the operator (``make cluster``).

etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from their Go modules (``cluster/tools/``),
kwok simulating GPU nodes. Only the kubelet is simulated: pods are scheduled, bound and reported Running, but their
images never run. Dev tooling: needs the ``dev`` extra (cryptography, kubectl) and a Go toolchain for the first build.
"""

from pipefill.devcluster.bins import BinaryMissing, ensure_built
from pipefill.devcluster.cluster import ControlPlane, StartFailed, kubectl_binary, start

__all__ = ["BinaryMissing", "ControlPlane", "StartFailed", "ensure_built", "kubectl_binary", "start"]
