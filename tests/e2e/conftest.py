"""`make e2e`: the product on a real node, as a user runs it (docs/cluster.md, "The whole product on the real node").

One session: a control plane with a real node (kubelet, containerd, runc), the three images built with buildah (the
trainer and fill images with the CPU torch) and imported into the node, and the operator installed with `helm
install` from charts/pipefill, running as a pod there. Minutes of image builds the first time (seconds once cached),
so `make test` leaves these tests out: they are collected only with PIPEFILL_E2E=1, which `make e2e` sets. With
CI=true (which `make e2e` also sets) a missing piece fails instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_harness import E2E, Operator, RealCluster, build_and_load, finish, install_operator
from e2e_prometheus import Prometheus, scraping_rank_pods

from pipefill.devcluster import BinaryMissing, bins, start

_IN_CI = os.environ.get("CI", "").lower() == "true"
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without PIPEFILL_E2E=1 the e2e tests are deselected (not skipped: CI=true counts skips as failures)."""
    if os.environ.get(E2E) == "1":
        return
    mine = [item for item in items if _HERE in Path(str(item.fspath)).parents]
    if mine:
        config.hook.pytest_deselected(items=mine)
        items[:] = [item for item in items if item not in mine]


def _unavailable(reason: str) -> None:
    if _IN_CI:
        pytest.fail(f"CI=true and the e2e tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster]:
    """A control plane (one kwok node) with the real node, in a short directory under /tmp (the kubelet's sockets
    live under it)."""
    if os.geteuid() != 0:
        _unavailable("a real node needs root")
    for tool in ("buildah", "debootstrap"):
        if shutil.which(tool) is None:
            _unavailable(f"no {tool}: apt-get install {tool}")
    try:
        for name in ("kubelet", "containerd", "runc", "pause", "helm", "etcd", "kube-apiserver", "kwok"):
            bins.binary(name)
    except BinaryMissing as exc:
        _unavailable(str(exc))
    root = Path(tempfile.mkdtemp(prefix="pf-e2e-", dir="/tmp"))
    cp = start(root / "cluster", nodes=1, tainted=0, real_node=True)
    try:
        yield RealCluster(cp, root)
    finally:
        cp.stop()
        for proc in cp.real_node.processes if cp.real_node else []:  # killed by node.stop; reaped here, their parent
            if proc.popen is not None:
                proc.popen.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def images_loaded(real_cluster: RealCluster) -> dict[str, float]:
    """The three images in the node's containerd (built or taken from buildah's cache); seconds each step took."""
    return build_and_load(real_cluster)


@pytest.fixture(scope="session")
def operator(real_cluster: RealCluster, images_loaded: dict[str, float]) -> Operator:
    """The operator, installed by `helm install` and running as a pod on the real node."""
    return install_operator(real_cluster)


@pytest.fixture(scope="session")
def prometheus(real_cluster: RealCluster) -> Iterator[Prometheus]:
    """Prometheus scraping the rank pods the tests point it at (Prometheus.discover), as the chart's PodMonitor would."""
    with scraping_rank_pods(real_cluster.root / "prometheus") as prom:
        yield prom


@pytest.fixture
def namespace(real_cluster: RealCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace for one test; its jobs and their pods are gone when the test ends (the next test's pods take the
    same host ports)."""
    name = request.node.name.removeprefix("test_").replace("_", "-")[:40].rstrip("-")
    real_cluster.cp.kubectl("create", "namespace", name)
    yield name
    finish(real_cluster, name)
