"""Helpers of the user-code tests: workload modules as a user would write them, an installed package that registers
workloads as entry points (a real ``*.dist-info`` on a path entry, as pip leaves it), and FillJob manifests that name
code on the fill storage, in a ConfigMap or by entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from fill_helpers import subprocess_env
from launched import popen

from pipefill import env

# A workload in two modules: the class imports its helper relatively (code is loaded as a private package).
EMBED_PY = """
import time
from typing import Any, ClassVar

import numpy as np

from pipefill_fill.workload import SampleWorkload

from . import helpers


class Scaled(SampleWorkload):
    kind: ClassVar[str] = "inference"

    def setup(self, device: Any, memory_budget_bytes: int) -> None:
        self.factor = float(self.context.parameters.get("factor", helpers.FACTOR))
        self.delay_s = float(self.context.parameters.get("delayUs", 0)) * 1e-6  # a per-sample cost to plan with

    def step(self, batch_size: int) -> int:
        start, end = self.take(batch_size)
        time.sleep(self.delay_s * (end - start))
        ids = np.arange(start, end, dtype=np.int64)
        self.context.emit(ids, (ids[:, None] * self.factor).astype(np.float32))
        return end - start
"""
HELPERS_PY = "FACTOR = {factor}\n"

# Each of these must fail its job alone, with a message that says why.
RAISES_PY = "import math\nRESULT = 1 / 0\n"
EXITS_PY = "import sys\nsys.exit(3)\n"
BAD_STEP_PY = """
from typing import Any, ClassVar


class NoBatch:
    kind: ClassVar[str] = "inference"

    def __init__(self, context: Any) -> None:
        self.context = context

    def setup(self, device: Any, memory_budget_bytes: int) -> None: ...

    def step(self) -> int:  # the executor passes a batch size
        return 0

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None: ...

    def done(self) -> bool:
        return True
"""


def write_code(directory: Path, *, factor: float = 2.0, extra: dict[str, str] | None = None) -> Path:
    """A code directory: ``embed.py`` (class ``Scaled``), ``helpers.py`` and ``extra`` modules."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "embed.py").write_text(EMBED_PY)
    (directory / "helpers.py").write_text(HELPERS_PY.format(factor=factor))
    for name, text in (extra or {}).items():
        (directory / name).write_text(text)
    return directory


def write_config_map(directory: Path, name: str, data: dict[str, str]) -> dict[str, Any]:
    """A ConfigMap manifest where the files work source of ``directory`` reads it; returns it."""
    doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
    (directory / "configmaps").mkdir(parents=True, exist_ok=True)
    (directory / "configmaps" / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    return doc


def install_package(site: Path, *, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> Path:
    """Install a package the way pip leaves one: modules and ``<dist>-1.0.dist-info`` with its entry points."""
    site.mkdir(parents=True, exist_ok=True)
    for name, text in modules.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[pipefill.workloads]\n{lines}")
    return site


def user_job(directory: Path, name: str, *, total: int = 40, **workload: Any) -> Path:
    """A FillJob manifest whose workload is ``workload`` (importPath, code, entryPoint, parameters)."""
    spec: dict[str, Any] = {
        "workload": {"kind": "inference", **workload},
        "output": {"path": str(directory / "out" / name)},
        "totalSamples": total,
    }
    doc = {"apiVersion": "pipefill.io/v1alpha1", "kind": "FillJob", "metadata": {"name": name}, "spec": spec}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start_fill(tmp_path: Path, jobs: Path, *, cpu: int, python_path: Path | None = None, **extra: str) -> Any:
    """The fill executor (``python -m pipefill_fill``) on ``cpu``, its work from ``jobs``, channel and event log under
    ``tmp_path``; ``python_path``: a directory put first on its import path (an installed package); ``extra``: env."""
    names = {env.CHANNEL_DIR: "channel", env.OUT_DIR: "fill"}
    fill_env = subprocess_env(**{k: str(tmp_path / v) for k, v in names.items()})
    fill_env.update({env.WORK_SOURCE: f"files:{jobs}", env.DEVICE: "cpu", env.CPU_AFFINITY: str(cpu), **extra})
    argv = [sys.executable, "-m", "pipefill_fill"]
    if python_path is not None:  # an import path of its own: started as it is (a launcher would be its alone)
        fill_env["PYTHONPATH"] = os.pathsep.join([str(python_path), fill_env["PYTHONPATH"]])
        return subprocess.Popen(argv, env=fill_env, stderr=subprocess.PIPE, text=True)
    return popen(argv, env=fill_env, stderr=subprocess.PIPE, text=True)
