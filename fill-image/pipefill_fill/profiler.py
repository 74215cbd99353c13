"""The profiler: per candidate batch size, median step time and peak memory on the actual device, after warm-up.

Measurements are cached per (workload, device) in the job's output directory and taken again when either changes
(the workload's class or parameters, the device model, torch version or thread count). The workload's state is
snapshotted before and restored after, and its outputs are dropped while profiling, so profiling does no real work.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` after a reset; on CPU, the growth of the process's resident
set high-water mark (``VmHWM`` after resetting it through ``/proc/self/clear_refs``), 0 where Linux does not offer it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pipefill.plan import ProfilePoint
from pipefill_fill.atomic import atomic_write_bytes
from pipefill_fill.task import FillTask

__all__ = ["Profile", "device_key", "profile_task"]

log = logging.getLogger("pipefill_fill")


@dataclass(frozen=True)
class Profile:
    workload_id: str
    device_key: str
    points: tuple[ProfilePoint, ...]
    cached: bool = False

    def point(self, batch_size: int) -> ProfilePoint | None:
        return next((p for p in self.points if p.batch_size == batch_size), None)


def device_key(device: torch.device) -> str:
    """What identifies the device for the profile cache."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"cuda:{props.name}:{props.total_memory}:torch{torch.__version__}"
    return f"cpu:{platform.processor() or platform.machine()}:threads{torch.get_num_threads()}:torch{torch.__version__}"


def profile_task(
    task: FillTask,
    device: torch.device,
    *,
    memory_budget_bytes: int,
    max_step_s: float = 1.0,
    warmup: int = 2,
    repeats: int = 5,
    use_cache: bool = True,
) -> Profile:
    """Measure (or load from the cache) every candidate batch size the workload offers.

    Larger batch sizes are not tried once one exceeds ``max_step_s`` (longer than any bubble) or the memory budget,
    or runs out of memory.
    """
    wid, dkey = task.spec.workload_id, device_key(device)
    cache = (
        task.spec.output_dir / "profiles" / f"profile-{hashlib.sha1(f'{wid}|{dkey}'.encode()).hexdigest()[:16]}.json"
    )
    if use_cache and cache.exists():
        data = json.loads(cache.read_text())
        if data.get("workload_id") == wid and data.get("device_key") == dkey:
            points = tuple(ProfilePoint(**p) for p in data["points"])
            return Profile(wid, dkey, points, cached=True)
    snapshot = task.snapshot()
    task.begin_profiling()
    points: list[ProfilePoint] = []
    try:
        for bs in task.batch_sizes():
            point = _measure(task, device, bs, snapshot, warmup=warmup, repeats=repeats)
            if point is None:
                break
            if point.peak_bytes > memory_budget_bytes:
                log.info(
                    "profile %s: batch %d needs %d bytes > budget %d",
                    task.spec.name,
                    bs,
                    point.peak_bytes,
                    memory_budget_bytes,
                )
                break
            points.append(point)
            if point.step_s > max_step_s or ((point.items_per_step or bs) < bs and task.spec.kind == "inference"):
                break  # longer than any bubble, or the job has fewer samples left than this batch
    finally:
        task.end_profiling(snapshot)
    profile = Profile(wid, dkey, tuple(points))
    record = {
        "workload_id": wid,
        "device_key": dkey,
        "measured_unix_s": round(time.time(), 3),
        "points": [
            {
                "batch_size": p.batch_size,
                "step_s": p.step_s,
                "peak_bytes": p.peak_bytes,
                "items_per_step": p.items_per_step,
            }
            for p in points
        ],
    }
    atomic_write_bytes(cache, (json.dumps(record, indent=2) + "\n").encode())
    return profile


def _measure(
    task: FillTask, device: torch.device, bs: int, snapshot: dict[str, object], *, warmup: int, repeats: int
) -> ProfilePoint | None:
    times: list[float] = []
    items = 0
    base = _memory_reset(device)
    try:
        for i in range(warmup + repeats):
            task.workload.restore(dict(snapshot))  # every step measures the same batch
            t0 = time.perf_counter()
            items = int(task.workload.step(bs))
            _sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    except torch.OutOfMemoryError:
        log.info("profile %s: batch %d ran out of device memory", task.spec.name, bs)
        return None
    if items <= 0:
        return None
    peak = _memory_peak(device, base)
    return ProfilePoint(bs, statistics.median(times), peak, items if items != bs else None)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _memory_reset(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return 0
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        return _proc_status_kb("VmRSS") * 1024
    except OSError:
        return -1


def _memory_peak(device: torch.device, base: int) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if base < 0:
        return 0
    return max(0, _proc_status_kb("VmHWM") * 1024 - base)


def _proc_status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {key}")
