"""A real Prometheus scraping a real ``pipefill local`` run and the operator on the control plane, and its HTTP API.

Prometheus comes from ``make prometheus-bin`` (``$PIPEFILL_BINS/prometheus/``; ``make test`` fetches it first, never
inside a test's timeout). It scrapes the run's one metrics endpoint, which already labels every series with ``rank``
and ``container`` as a PodMonitor's relabelling does on a cluster; the scrape configuration adds the other labels the
PodMonitor would (``namespace``, ``training_job``) as static labels, with ``honor_labels: false`` as PodMonitors
default to. The operator (``operator_run``) is a second target, labelled with its own namespace as a ServiceMonitor
would label it. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import launched
import yaml
from operator_run import OPERATOR_NAMESPACE_LABEL, OperatorRun
from waiting import wait_for

from pipefill import env
from pipefill.local.procs import free_port

__all__ = ["SCRAPE_INTERVAL_S", "STATIC_LABELS", "Prometheus", "prometheus_binary", "run_scraped"]

ROOT = Path(__file__).resolve().parents[2]
RULE_FILE = ROOT / "charts" / "pipefill" / "rules" / "pipefill.rules.yaml"
SCRAPE_INTERVAL_S = 1
STATIC_LABELS = {"namespace": "pipefill-test", "training_job": "cpu-demo"}
BASELINE_EVERY_STEPS = 10
"""Quiet steps for the no-fill baseline: 8 in the 80-step run (the default, one in 50, would give one)."""


def prometheus_binary() -> Path:
    """The binary ``make prometheus-bin`` put in place; a clear error when it has not run."""
    bins = Path(os.environ.get("PIPEFILL_BINS", Path.home() / ".cache" / "pipefill" / "bins"))
    binary = bins / "prometheus" / "prometheus"
    if not os.access(binary, os.X_OK):
        raise FileNotFoundError(f"{binary} is missing: run `make prometheus-bin` (make test does it first)")
    return binary


@dataclass
class Prometheus:
    """The HTTP API of a running Prometheus."""

    url: str

    def get(self, path: str, **params: str | list[str]) -> Any:
        """``data`` of a successful answer; an ``AssertionError`` with Prometheus' own error message otherwise."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        assert body["status"] == "success", f"{path} {params}: {body.get('errorType')}: {body.get('error')}"
        return body["data"]

    def query_range(self, expr: str, start_s: float, end_s: float, step_s: float = 1.0) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query_range", query=expr, start=str(start_s), end=str(end_s), step=str(step_s))
        result: list[dict[str, Any]] = data["result"]
        return result

    def series(self, metric: str, start_s: float, end_s: float) -> list[dict[str, str]]:
        found: list[dict[str, str]] = self.get(
            "/api/v1/series", **{"match[]": metric, "start": str(start_s), "end": str(end_s)}
        )
        return found


@dataclass
class ScrapedRun:
    """What the dashboards test needs: the API and the window in which the run was scraped."""

    prometheus: Prometheus
    start_s: float
    end_s: float
    version: str
    fill_job: str


def _manifests(tmp: Path) -> list[Path]:
    """The demo job and its FillJob, shortened to about half a minute on 2 cores, writing only under ``tmp``."""
    job = yaml.safe_load((ROOT / "examples" / "cpu-demo.yaml").read_text())
    job["spec"]["steps"] = 80
    job["spec"]["data"]["path"] = str(ROOT / "examples" / "data" / "corpus.txt")
    job["spec"]["checkpoint"] = {"path": str(tmp / "ckpt"), "intervalSteps": 40}
    fill = yaml.safe_load((ROOT / "examples" / "fill-inference.yaml").read_text())
    fill["spec"]["output"]["path"] = str(tmp / "fill-out")
    paths = [tmp / "job.yaml", tmp / "fill.yaml"]
    for path, doc in zip(paths, (job, fill), strict=True):
        path.write_text(yaml.safe_dump(doc))
    assert job["metadata"]["name"] == STATIC_LABELS["training_job"]
    return paths


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    wait_for(ready, f"prometheus at {url} to be ready", timeout_s, interval_s=0.1)


def _scrape(job_name: str, port: int, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "job_name": job_name,
        "honor_labels": False,
        "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": labels}],
    }


@contextmanager
def run_scraped(tmp: Path, operator: OperatorRun) -> Iterator[ScrapedRun]:
    """Start Prometheus (the operator is running already), give the operator its jobs, run the short local job, all
    under its scrape; yield the API and the window; Prometheus is stopped on exit (the operator by its own context)."""
    binary = prometheus_binary()
    metrics_port, web_port = free_port(), free_port()
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
        },
        "rule_files": [str(RULE_FILE)],
        "scrape_configs": [
            _scrape("pipefill-local", metrics_port, STATIC_LABELS),
            _scrape("pipefill-operator", operator.metrics_port, {"namespace": OPERATOR_NAMESPACE_LABEL}),
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{web_port}"
    argv = [
        str(binary),
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{web_port}",
        "--log.level=warn",
    ]
    with open(tmp / "prometheus.log", "wb") as log, subprocess.Popen(argv, stdout=log, stderr=log) as proc:
        try:
            _wait_ready(url, proc)
            version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
            files = [arg for path in _manifests(tmp) for arg in ("-f", str(path))]
            local = [sys.executable, "-m", "pipefill", "local", *files, "--out", str(tmp / "out")]
            start_s = time.time()
            operator.create_jobs()
            done = launched.run(
                [*local, "--metrics-port", str(metrics_port), "--plain", "--no-timeline"],
                capture_output=True,
                text=True,
                timeout=90,
                cwd=tmp,
                env={**os.environ, env.BASELINE_EVERY_STEPS: str(BASELINE_EVERY_STEPS)},
            )
            end_s = time.time()
            (tmp / "local.log").write_text(done.stdout + done.stderr)
            assert done.returncode == 0, done.stdout + done.stderr
            fill_job = yaml.safe_load((tmp / "fill.yaml").read_text())["metadata"]["name"]
            yield ScrapedRun(Prometheus(url), start_s, end_s, version.splitlines()[0], fill_job)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
