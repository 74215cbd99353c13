"""A real Prometheus scraping the rank pods on the real node where the chart's PodMonitor would have it scrape them.

The PodMonitor's discovery is the Prometheus Operator's kubernetes_sd (role pod), which Debian's Prometheus build
leaves out; so :meth:`Prometheus.discover` does its part from the API server instead: the pods of the operator's jobs,
their ports trainer-metrics and fill-metrics (the fill executor's is a native sidecar's, an init container's) at the
pod's address, training_job, rank and container from the pod (the PodMonitor's relabelling), written as a file_sd
target file that Prometheus re-reads. Listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipefill.children import JOB_LABEL
from pipefill.devcluster.procs import free_port
from pipefill.pods import RANK_LABEL

__all__ = ["Prometheus", "scraping_rank_pods"]

_PORTS = ("trainer-metrics", "fill-metrics")  # by name, as the PodMonitor selects them


@dataclass
class Prometheus:
    url: str
    targets: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        params = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=30) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def discover(self, pods: list[dict[str, Any]]) -> int:
        """The PodMonitor's targets among ``pods`` (Pod objects from the API), for Prometheus to scrape; how many."""
        groups = []
        for pod in pods:
            meta, spec = pod["metadata"], pod["spec"]
            labels = meta.get("labels", {})
            if labels.get("app.kubernetes.io/managed-by") != "pipefill-operator" or RANK_LABEL not in labels:
                continue
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                for port in container.get("ports", []):
                    if port.get("name") in _PORTS and pod["status"].get("podIP"):
                        groups.append(
                            {
                                "targets": [f"{pod['status']['podIP']}:{port['containerPort']}"],
                                "labels": {
                                    "namespace": meta["namespace"],
                                    "training_job": labels[JOB_LABEL],
                                    "rank": labels[RANK_LABEL],
                                    "container": container["name"],
                                },
                            }
                        )
        tmp = self.targets.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.rename(self.targets)
        return len(groups)


def _config(targets: Path) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s"},
        "scrape_configs": [
            {"job_name": "rank-pods", "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}
        ],
    }


@contextmanager
def scraping_rank_pods(tmp: Path) -> Iterator[Prometheus]:
    bins = Path(os.environ.get("PIPEFILL_BINS", Path.home() / ".cache" / "pipefill" / "bins"))
    binary = bins / "prometheus" / "prometheus"
    assert os.access(binary, os.X_OK), f"{binary} is missing: run `make prometheus-bin`"
    tmp.mkdir(parents=True, exist_ok=True)
    targets = tmp / "targets.json"
    targets.write_text("[]")
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(_config(targets)))
    port = free_port()
    argv = [
        str(binary),
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    url = f"http://127.0.0.1:{port}"
    with open(tmp / "prometheus.log", "wb") as log, subprocess.Popen(argv, stdout=log, stderr=log) as proc:
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, (
                    f"prometheus exited with {proc.returncode}: {(tmp / 'prometheus.log').read_text()}"
                )
                try:
                    with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "prometheus not ready within 60 s"
                time.sleep(0.2)
            yield Prometheus(url, targets)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
