"""What a benchmark ran on: the machine's cores, CPU model, GPUs, software versions and load.

The core never imports torch: the GPUs are asked of torch in a child process.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["describe_machine", "visible_gpus"]


def visible_gpus() -> tuple[list[str], str]:
    """Names of the visible CUDA GPUs (torch asked in a child process: the core never imports it), and why none.
    Where NVML (nvidia-ml-py) says there is no driver or no GPU, that is the answer: torch's CUDA build takes seconds
    to import only to count none."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        pass
    else:
        try:
            pynvml.nvmlInit()
            try:
                count = pynvml.nvmlDeviceGetCount()
            finally:
                pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            return [], f"no NVIDIA driver: NVML says {exc}"
        if count == 0:
            return [], "NVML sees no GPU"
    code = "import torch\nfor i in range(torch.cuda.device_count()): print(torch.cuda.get_device_name(i))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], str(exc)
    if out.returncode != 0:
        return [], (out.stderr.strip().splitlines() or ["torch failed"])[-1]
    return [n for n in out.stdout.splitlines() if n.strip()], "torch.cuda.device_count() is 0"


def describe_machine(*, cores_used: list[int] | None, gpus: list[str]) -> dict[str, Any]:
    """Cores, CPU model, GPUs, torch and Python versions and the load average now: what a benchmark's result is
    worth depends on them (figures are compared only within one machine and one run)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        cpuinfo = []
    try:
        torch_version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    return {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "cores_used": cores_used,
        "cpu_model": next(
            (x.split(":", 1)[1].strip() for x in cpuinfo if x.startswith("model name")), platform.machine()
        ),
        "gpus": gpus or None,
        "torch": torch_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_1_5_15_start": [round(x, 2) for x in os.getloadavg()],
    }
