"""Helpers of the fill executor's tests: small FillJob manifests and subprocess environments."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def write_job(
    directory: Path,
    name: str,
    *,
    builtin: str | None = "encoder-inference",
    import_path: str | None = None,
    kind: str = "inference",
    total: int = 64,
    parameters: dict[str, Any] | None = None,
    output: Path | None = None,
    priority: int = 0,
) -> Path:
    """A FillJob manifest in ``directory`` with tiny defaults; returns its path."""
    workload: dict[str, Any] = {"kind": kind, "parameters": parameters or {"layers": 1, "hiddenSize": 32, "heads": 2}}
    if builtin:
        workload["builtin"] = builtin
    if import_path:
        workload["importPath"] = import_path
    spec: dict[str, Any] = {
        "workload": workload,
        "output": {"path": str(output or directory / "out" / name)},
        "priority": priority,
    }
    spec["totalSamples" if kind == "inference" else "totalSteps"] = total
    doc = {"apiVersion": "pipefill.io/v1alpha1", "kind": "FillJob", "metadata": {"name": name}, "spec": spec}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def subprocess_env(**extra: str) -> dict[str, str]:
    """The test's environment for a child process: one thread, this checkout's tests importable."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])})
    env.update(extra)
    return env
