"""Helpers of the fill executor's tests: small FillJob manifests and subprocess environments."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from launched import Proc, popen
from sharing import own_core
from waiting import wait_for

from pipefill import env as env_names
from pipefill.events import Event, read_events

HERE = Path(__file__).resolve().parent
STARTED: list[Proc] = []
"""every process the helpers below started: the folder's conftest kills those still running after each test (a test
stopped by pytest-timeout, or failed before its own clean-up, would otherwise leave a producer and an executor
spinning on the core the next tests pin to, and fail them too)"""


def _started(proc: Proc) -> Any:
    STARTED.append(proc)
    return proc


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
    max_parallel_ranks: int = 1,
    min_slice_samples: int = 64,
) -> Path:
    """A FillJob manifest in ``directory`` with tiny defaults; returns its path. A split job (``max_parallel_ranks``
    over 1) is cut into slices of at least ``min_slice_samples`` (``spec.minSliceSamples``; 64 here, so that small
    jobs still have several slices for the tests of slicing)."""
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
    if max_parallel_ranks != 1:
        spec["maxParallelRanks"] = max_parallel_ranks
        spec["minSliceSamples"] = min_slice_samples
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


def start_producer(
    channel: Path,
    *,
    bubbles_ms: str,
    count: int,
    compute_ms: float = 15.0,
    cpu: int | None = None,
    log: Path | None = None,
    warmup: int = 0,
    close_at: float = 1.0,
) -> subprocess.Popen[str]:
    """The synthetic trainer (the real channel producer) emitting ``count`` bubbles into ``channel`` (``log``: the
    JSONL of each), after ``warmup`` bubbles that are not logged; each closed after ``close_at`` of its length."""
    args = ["--channel-dir", str(channel), "--bubbles-ms", bubbles_ms, "--compute-ms", str(compute_ms)]
    args += ["--close-at", str(close_at)]
    args += ["--count", str(count), "--warmup-bubbles", str(warmup)]
    args += ["--cpu", str(cpu)] if cpu is not None else []
    args += ["--log", str(log)] if log is not None else []
    return _started(
        subprocess.Popen(
            [sys.executable, "-m", "pipefill.bench.synthetic_trainer", *args],
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
    )


def start_executor(
    channel: Path, jobs: Path, out: Path, *, rank: int = 0, cpu: int | None = None, priority: str | None = None
) -> Proc:
    """The fill executor (``python -m pipefill_fill``) of one rank, its work from the manifests in ``jobs``
    (``priority``: its filling thread's CPU priority, PIPEFILL_FILL_CPU_PRIORITY)."""
    env = subprocess_env(
        **{
            env_names.CHANNEL_DIR: str(channel),
            env_names.WORK_SOURCE: f"files:{jobs}",
            env_names.OUT_DIR: str(out),
            env_names.RANK: str(rank),
            env_names.DEVICE: "cpu",
            env_names.FILL_GUARD_MS: "1",
        },
    )
    if cpu is not None:
        env[env_names.CPU_AFFINITY] = str(cpu)
    if priority is not None:
        env[env_names.FILL_CPU_PRIORITY] = priority
    return _started(popen([sys.executable, "-m", "pipefill_fill"], env=env, stderr=subprocess.PIPE, text=True))


def start_drive(manifest: Path, batch: int, every: int, mode: str = "") -> Proc:
    """``_drive.py``: one job run to completion without bubbles, a commit every ``every`` steps (``mode``: partial
    steps, see its docstring), pipes for its READY/DONE lines."""
    return _started(
        popen(
            [sys.executable, "-m", "_drive", str(manifest), str(batch), str(every), *([mode] if mode else [])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=subprocess_env(),
        )
    )


def fill_on_one_cpu(
    tmp: Path, jobs: Path, until: Callable[[list[Event]], bool], what: str, timeout_s: float = 120
) -> list[Event]:
    """The executor (its work from ``jobs``) and a producer of 20 ms bubbles between 10 ms of compute, sharing one
    CPU, until ``until`` holds for the fill's events (``what``: named if it never does within ``timeout_s``); both stopped,
    the executor's exit checked; its events."""
    cpu = own_core()
    fill = start_executor(tmp / "channel", jobs, tmp / "fill", cpu=cpu)
    producer = start_producer(tmp / "channel", bubbles_ms="20", count=100_000, compute_ms=10.0, cpu=cpu)
    log = tmp / "fill" / "fill-events.jsonl"
    try:
        wait_for(lambda: until(read_events(log)), what, timeout_s, interval_s=0.1)
    finally:
        producer.send_signal(signal.SIGKILL)
        producer.communicate(timeout=10)
        _, err = fill.communicate(timeout=60)
    assert fill.returncode == 0, err
    return read_events(log)
