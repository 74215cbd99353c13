"""Helpers of the chart's tests: the real helm (built by `make cluster-bins`), rendering with given values, and the
operator run as a process with the arguments of the Deployment the chart rendered.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import yaml
from operator_harness import OperatorProcess

from pipefill.devcluster import bins
from pipefill.devcluster.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pipefill"
RELEASE_NAMESPACE = "pipefill-system"
MONITORING = "monitoring.coreos.com/v1"


def helm_binary() -> Path:
    return bins.binary("helm")


def helm(*args: str, kubeconfig: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm with its own empty config and cache (nothing read from or written to the user's)."""
    home = Path(tempfile.gettempdir()) / "pipefill-chart-tests-helm"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_") and k != "KUBECONFIG"}
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(home / var.lower())
    argv = [str(helm_binary()), *args]
    if kubeconfig is not None:
        argv.append(f"--kubeconfig={kubeconfig}")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=180)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def values_file(values: dict[str, Any], directory: Path) -> Path:
    path = Path(tempfile.mkstemp(suffix=".json", dir=directory)[1])
    path.write_text(json.dumps(values))
    return path


def template_args(
    values: dict[str, Any], tmp: Path, *, release: str = "pf", api_versions: tuple[str, ...] = (), chart: Path = CHART
) -> list[str]:
    args = ["template", release, str(chart), "--namespace", RELEASE_NAMESPACE, "-f", str(values_file(values, tmp))]
    for version in api_versions:
        args += ["--api-versions", version]
    return args


def render(
    values: dict[str, Any], tmp: Path, *, release: str = "pf", api_versions: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Every object `helm template` renders with ``values`` (merged over values.yaml)."""
    out = helm(*template_args(values, tmp, release=release, api_versions=api_versions)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render_error(values: dict[str, Any], tmp: Path, *, api_versions: tuple[str, ...] = ()) -> str:
    """helm's error for ``values``, which must be refused."""
    proc = helm(*template_args(values, tmp, api_versions=api_versions), check=False)
    assert proc.returncode != 0, f"helm rendered {values} instead of refusing it"
    return proc.stderr


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = by_kind(objs, kind)
    return found


def local_args(deployment: dict[str, Any], *, pod_ip: str = "127.0.0.1") -> tuple[list[str], dict[str, str]]:
    """The operator container's arguments with ``pod_ip`` for $(POD_IP) and free ports for its endpoints, and the
    URLs of those endpoints (``metrics``, ``liveness``)."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "pipefill_operator"]
    args, urls = [], {}
    for arg in container["args"]:
        flag, _, value = arg.partition("=")
        if "$(POD_IP)" in value:
            value = re.sub(r"\$\(POD_IP\)(\]?):\d+", lambda m: f"{pod_ip}{m[1]}:{free_port()}", value)
            if flag == "--liveness":
                urls["liveness"] = value
            else:
                host, _, port = value.rpartition(":")
                urls["metrics"] = f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"
            arg = f"{flag}={value}"
        args.append(arg)
    return args, urls


class DeployedOperator(OperatorProcess):
    """``python -m pipefill_operator`` with the Deployment's arguments and a ServiceAccount's kubeconfig, as the pod
    would run it; ``start`` returns once it serves, ``stop`` ends it (both may be called again)."""

    def __init__(self, args: list[str], kubeconfig: Path, log_path: Path) -> None:
        super().__init__(kubeconfig, log_path)
        self.args = args

    def start(self, timeout_s: float = 60) -> None:
        argv = [sys.executable, "-m", "pipefill_operator", f"--kubeconfig={self.kubeconfig}", *self.args]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        ready = threading.Event()
        self._reader = threading.Thread(target=self._copy_log, args=(self.proc, ready), daemon=True)
        self._reader.start()
        if not ready.wait(timeout_s) or self.proc.poll() is not None:
            code = self.kill()
            raise AssertionError(f"the operator did not start (exit {code}): {self.log_text()[-3000:]}")
