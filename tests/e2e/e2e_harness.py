"""Helpers of `make e2e`: the images on the node, the operator from the chart, the CPU demo made to fit the real node,
and waits on what the cluster reports.

The dev cluster's real node has no pod network, no Service routing and no cluster DNS (docs/cluster.md, "A real
node"), so what a user adds for it is added here the same way: host-network pods on the node (its taint tolerated),
the API server's address for the containers that talk to it (the `kubernetes` Service's address is not routed), and
rank 0's name in every rank pod's /etc/hosts (`spec.podTemplate.hostAliases`: MASTER_ADDR).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import yaml

from pipefill.devcluster import ControlPlane, bins, images
from pipefill.devcluster.nodeconf import NODE_IP, POD_PLACEMENT
from pipefill.pods import pod_name, service_name
from pipefill.spec import PipelineTrainingJob, parse

__all__ = [
    "E2E",
    "FILL_OUTPUT",
    "Operator",
    "RealCluster",
    "build_and_load",
    "demo_objects",
    "finish",
    "install_operator",
    "last_logged_step",
    "wait_for",
]

E2E = "PIPEFILL_E2E"
FILL_OUTPUT = "embed-corpus"  # the FillJob's output, under <session>/<namespace>/fill-storage/ on the host
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pipefill"
RELEASE, RELEASE_NAMESPACE = "pipefill", "pipefill-system"
T = TypeVar("T")
_ONE_THREAD = {"name": "OMP_NUM_THREADS", "value": "1"}


@dataclass
class RealCluster:
    cp: ControlPlane
    root: Path  # the session's directory: the cluster's, the volumes' host paths

    @property
    def api_host_port(self) -> tuple[str, str]:
        url = urlparse(self.cp.server)
        return str(url.hostname), str(url.port)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(self.cp.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout)
        return obj

    def apply(self, objects: list[dict[str, Any]]) -> None:
        self.cp.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects, sort_keys=False))


@dataclass
class Operator:
    pod: str
    values: dict[str, Any]


def wait_for(check: Callable[[], T | None], what: str, *, timeout_s: float, describe: Callable[[], str] = str) -> T:
    """Poll ``check`` (it reads the API) until it returns something; fail naming ``what`` and what ``describe`` says."""
    deadline = time.monotonic() + timeout_s
    delay_s = 0.1
    while True:
        got = check()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}:\n{describe()}")
        time.sleep(delay_s)
        delay_s = min(delay_s * 1.5, 2.0)


def _app_version() -> str:
    version: str = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    return str(version)


# Disk, in GB, as measured here (docs/benchmarks.md, "On a real node"): per image, buildah's copy, its OCI archive and
# the node's (containerd's content and its unpacked snapshot); a CPU torch image's build holds ~10 more until it ends.
_DISK_GB = {"operator": (0.4, 0.1, 0.5), "trainer": (4.6, 2.6, 7.2), "fill": (4.4, 2.5, 7.0)}
_BUILD_PEAK_GB = 10.0


def disk_needed_gb(cluster_fs_total_gb: float, *, built: dict[str, bool], archived: dict[str, bool]) -> float:
    """What the run will write at its peak, plus the kubelet's eviction margin (2 % of the filesystem: under it the
    node is tainted with disk pressure and no pod starts there) and 2 GB for the machine's other work."""
    need = 0.02 * cluster_fs_total_gb + 2.0
    for name, (image, archive, node_copy) in _DISK_GB.items():
        need += node_copy + (0 if built[name] else image) + (0 if archived[name] else archive)
    return need + (_BUILD_PEAK_GB if not all(built[n] for n in ("trainer", "fill")) else 0.0)


def check_disk(cluster: RealCluster, base: str) -> None:
    """Fail before the builds rather than fill the machine's disk on the way (a full disk fails everyone's work)."""
    refs = {name: f"ghcr.io/pipefill/{name}:{_app_version()}" for name in images.IMAGES}
    keys = {name: images.key_of(name, base=base, torch="cpu") for name in images.IMAGES}
    built = {name: images.is_built(refs[name], keys[name]) for name in images.IMAGES}
    archived = {name: images.archive_path(refs[name], keys[name]).exists() for name in images.IMAGES}
    usage = shutil.disk_usage(cluster.root)
    need = disk_needed_gb(usage.total / 1e9, built=built, archived=archived)
    to_build = [name for name, done in built.items() if not done] or ["none"]
    assert usage.free / 1e9 >= need, (
        f"disk: {usage.free / 1e9:.1f} GB free under {cluster.root}, and this run needs about {need:.0f} GB (images to "
        f"build: {', '.join(to_build)}; the node's copies; the kubelet's 2 % margin): free space (`buildah rmi` of "
        "images no longer used, ~/.cache/pipefill/images) or run it where the disk has room"
    )


def build_and_load(cluster: RealCluster) -> dict[str, float]:
    """Build the three images (the trainer's and fill's with the CPU torch) unless buildah holds them with the same
    inputs, and import them into the node's containerd; the seconds of each step, also written to
    <session>/timings.json."""
    node = cluster.cp.real_node
    assert node is not None, "the session's cluster has no real node"
    timings: dict[str, float] = {}
    started = time.monotonic()
    base = images.local_base()
    timings["base"] = time.monotonic() - started
    check_disk(cluster, base)
    for name in images.IMAGES:
        ref = f"ghcr.io/pipefill/{name}:{_app_version()}"
        started = time.monotonic()
        key = images.build(name, ref, base=base, torch="cpu")
        timings[f"{name} build"] = time.monotonic() - started
        started = time.monotonic()
        node.import_image(images.archive(ref, key))
        timings[f"{name} load"] = time.monotonic() - started
    (cluster.root / "timings.json").write_text(json.dumps(timings, indent=1))
    return timings


def _helm(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    """helm with its own empty configuration (nothing read from or written to the user's)."""
    home = Path(tempfile.gettempdir()) / "pipefill-e2e-helm"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_") and k != "KUBECONFIG"}
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(home / var.lower())
    argv = [str(bins.binary("helm")), *args, f"--kubeconfig={kubeconfig}"]
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=400)


def api_env(cluster: RealCluster) -> list[dict[str, str]]:
    """Where a container finds the API server here: the `kubernetes` Service's address is not routed (no kube-proxy)."""
    host, port = cluster.api_host_port
    return [{"name": "KUBERNETES_SERVICE_HOST", "value": host}, {"name": "KUBERNETES_SERVICE_PORT", "value": port}]


def free_host_ports(count: int, *, start: int) -> int:
    """The first of ``count`` consecutive TCP ports from ``start`` up that nothing on this host listens on now: the
    real node's pods use the host's network, which other processes on this machine share."""
    for base in range(start, start + 2000, count):
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind(("0.0.0.0", port))
        except OSError:
            continue
        return base
    raise AssertionError(f"no {count} free consecutive ports from {start} on this host")


def operator_values(cluster: RealCluster) -> dict[str, Any]:
    """The chart's values for the real node: the imported image, the node's network, the API server's address."""
    return {
        "image": {"pullPolicy": "Never"},
        "operator": {
            "statusIntervalSeconds": 5,
            "hostNetwork": True,
            "nodeSelector": POD_PLACEMENT["nodeSelector"],
            "tolerations": POD_PLACEMENT["tolerations"],
            "extraEnv": api_env(cluster),
            # the host's network: a port nothing on this machine holds now (the default 9402 may be taken)
            "metrics": {"port": free_host_ports(1, start=9402)},
        },
    }


def describe_pods(cluster: RealCluster, namespace: str) -> str:
    pods = cluster.cp.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
    events = cluster.cp.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout
    return f"{pods}\n{events[-4000:]}"


def install_operator(cluster: RealCluster) -> Operator:
    """`helm install` the chart; returns once the operator pod is Ready on the real node."""
    values = operator_values(cluster)
    path = cluster.root / "operator-values.json"
    path.write_text(json.dumps(values))
    done = _helm(
        "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--create-namespace", "-f", str(path),
        "--take-ownership",  # of the CRDs `cluster up` applied, as README says
        kubeconfig=cluster.cp.kubeconfig,
    )  # fmt: skip
    assert done.returncode == 0, f"helm install failed: {done.stderr}"

    def ready() -> str | None:
        out = cluster.cp.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "json").stdout
        for pod in json.loads(out)["items"]:
            conditions = pod["status"].get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return str(pod["metadata"]["name"])
        return None

    name = wait_for(
        ready, "the operator pod Ready", timeout_s=180, describe=lambda: describe_pods(cluster, RELEASE_NAMESPACE)
    )
    return Operator(name, values)


def _static_volume(name: str, namespace: str, path: Path, *, read_only: bool) -> list[dict[str, Any]]:
    """A hostPath PersistentVolume bound to its claim from the start (no provisioner here)."""
    mode = "ReadOnlyMany" if read_only else "ReadWriteMany"  # every rank writes its checkpoints there
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{namespace}-{name}"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": [mode],
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": name},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": [mode],
            "storageClassName": "",
            "volumeName": f"{namespace}-{name}",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    return [pv, pvc]


def demo_objects(
    cluster: RealCluster, namespace: str, *, steps: int, total_samples: int, checkpoint_every: int = 20
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """examples/cpu-demo.yaml and examples/fill-inference.yaml made to fit the real node (2 CPUs): small requests,
    the corpus and the checkpoints on volumes (hostPath under the session's directory, world-writable: the pods run
    as uid 1000 and fsGroup does not reach a hostPath), host network, MASTER_ADDR in /etc/hosts, the API server's
    address for the fill executor. Returns (volumes and claims, job, FillJob)."""
    data = cluster.root / namespace / "data"
    checkpoints = cluster.root / namespace / "checkpoints"
    fills = cluster.root / namespace / "fill-storage"
    data.mkdir(parents=True)
    checkpoints.mkdir()
    fills.mkdir()
    shutil.copy(ROOT / "examples" / "data" / "corpus.txt", data / "corpus.txt")
    for path in (cluster.root, cluster.root / namespace, data):
        path.chmod(0o755)
    checkpoints.chmod(0o777)
    fills.chmod(0o777)
    job = yaml.safe_load((ROOT / "examples" / "cpu-demo.yaml").read_text())
    fill = yaml.safe_load((ROOT / "examples" / "fill-inference.yaml").read_text())
    job["metadata"]["namespace"] = fill["metadata"]["namespace"] = namespace
    spec = job["spec"]
    spec["steps"] = steps
    spec["data"]["claimName"] = "demo-data"
    spec["checkpoint"].update(claimName="demo-checkpoints", intervalSteps=checkpoint_every)
    spec["resources"].update(cpu="250m", memory="1Gi")
    # the FillJob's outputs on storage both rank pods mount: split over them, its slices are assembled into one
    # outputs.npy (without a claim the outputs live in one pod, and the queue does not split the job)
    spec["fill"].update(cpu="100m", memory="512Mi", storage={"claimName": "demo-fill"})
    parsed = parse(job)
    assert isinstance(parsed, PipelineTrainingJob)
    spec["podTemplate"] = {
        "hostNetwork": True,
        # rank 0's rendezvous and a metrics pair per rank: ports nothing on this machine holds now
        "hostPortBase": free_host_ports(1 + 2 * parsed.world_size, start=29500),
        "nodeSelector": copy.deepcopy(POD_PLACEMENT["nodeSelector"]),
        "tolerations": copy.deepcopy(POD_PLACEMENT["tolerations"]),
        "hostAliases": [{"ip": NODE_IP, "hostnames": [f"{pod_name(parsed, 0)}.{service_name(parsed)}"]}],
        # one thread each: two ranks' trainers and fill executors share the node's 2 cores (`pipefill local` pins
        # each pair to a core; a pod's CPU request pins nothing)
        "trainer": {"env": [_ONE_THREAD]},
        "fill": {"env": [*api_env(cluster), _ONE_THREAD]},
    }
    fill["spec"]["totalSamples"] = total_samples
    fill["spec"]["output"] = {"path": FILL_OUTPUT, "claimName": "demo-fill"}
    volumes = _static_volume("demo-data", namespace, data, read_only=True)
    volumes += _static_volume("demo-checkpoints", namespace, checkpoints, read_only=False)
    volumes += _static_volume("demo-fill", namespace, fills, read_only=False)
    return volumes, job, fill


def finish(cluster: RealCluster, namespace: str) -> None:
    """Delete the namespace's training jobs and wait until their pods are gone: the next test's rank pods take the
    same host ports."""
    cluster.cp.kubectl("delete", "pipelinetrainingjobs", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
    cluster.cp.kubectl("wait", "--for=delete", "pods", "--all", "-n", namespace, "--timeout=110s", check=False)


def last_logged_step(cluster: RealCluster, namespace: str, pod: str) -> int:
    """The last step the trainer of ``pod`` logged (rank 0's: ``rank 0: step S loss …``, every 10 steps)."""
    log = cluster.cp.kubectl("logs", pod, "-n", namespace, "-c", "trainer").stdout
    steps = [int(s) for s in re.findall(r"^rank \d+: step (\d+) ", log, re.MULTILINE)]
    assert steps, f"{pod}: no step in the trainer's log:\n{log[-2000:]}"
    return max(steps)
