"""CPU-only workarounds to run torchtitan's unchanged trainer on a machine without a GPU — for the demo and the tests,
never part of the bubble hook (which instruments whatever runs, and changes nothing of it).

torchtitan 0.2.2 assumes an accelerator: it asks torch for the available device type (None on a CPU-only machine,
which it takes for cuda), reads device properties and memory statistics the ``torch.cpu`` module does not have, and
passes ``device_ids`` to a barrier that gloo refuses. This module fills those gaps in ``torch`` and then runs
``torchtitan.train`` as ``python -m torchtitan.train`` would, with the same arguments:

    python examples/torchtitan/torchtitan_cpu.py --job.config_file examples/torchtitan/llama3-debug-pp.toml
"""

from __future__ import annotations

import runpy
import sys
from typing import Any

import torch
import torch._utils
import torch.distributed as dist


class _CpuProperties:
    name = "cpu"
    total_memory = 64 * 2**30


def _cpu_barrier(*args: Any, **kwargs: Any) -> Any:
    kwargs.pop("device_ids", None)  # gloo: "device_ids" is an NCCL argument
    return _barrier(*args, **kwargs)


torch._utils._get_available_device_type = lambda: "cpu"  # type: ignore[attr-defined]
for _name, _fn in {
    "get_device_name": lambda *a, **k: "cpu",
    "get_device_properties": lambda *a, **k: _CpuProperties(),
    "memory_stats": lambda *a, **k: {},
    "reset_peak_memory_stats": lambda *a, **k: None,
    "empty_cache": lambda *a, **k: None,
}.items():
    if not hasattr(torch.cpu, _name):
        setattr(torch.cpu, _name, _fn)
_barrier = dist.barrier
dist.barrier = _cpu_barrier

if __name__ == "__main__":
    sys.argv = ["torchtitan.train", *sys.argv[1:]]
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
