"""A fill job's whole profile at once (:func:`profile_task`), outside any bubble: each candidate batch size measured by
repeated steps of the same batch, the workload's state restored after each and its outputs dropped, so it does no work
(the naive co-location benchmark's runner). The executor profiles in bubbles instead (:mod:`pipefill_fill.profiler`).
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

from pipefill.plan import ProfilePoint
from pipefill_fill.device import device_sync, memory_peak, memory_reset
from pipefill_fill.profilecache import Profile, load_cached, store_profile
from pipefill_fill.task import FillTask

__all__ = ["profile_task", "stop_after"]

log = logging.getLogger("pipefill_fill")


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
    cached = load_cached(task, device, memory_budget_bytes=memory_budget_bytes) if use_cache else None
    if cached is not None:
        return cached
    snapshot = task.snapshot()
    task.begin_profiling()
    points: list[ProfilePoint] = []
    stopped_by = ""
    try:
        for bs in task.batch_sizes():
            point = _measure(task, device, bs, snapshot, warmup=warmup, repeats=repeats)
            if point is None or point.peak_bytes > memory_budget_bytes:
                stopped_by = "memory"
                break
            points.append(point)
            if stop_after(task, point, max_step_s):
                break
    finally:
        task.end_profiling(snapshot)
    return store_profile(task, device, points, memory_budget_bytes=memory_budget_bytes, stopped_by=stopped_by)


def stop_after(task: FillTask, point: ProfilePoint, max_step_s: float) -> bool:
    """Larger batches are pointless after one longer than any bubble, or one the job has fewer samples left for."""
    fewer_left = point.items_per_step is not None and point.items_per_step < point.batch_size
    return point.step_s > max_step_s or (fewer_left and task.spec.kind == "inference")


def _measure(
    task: FillTask, device: torch.device, bs: int, snapshot: dict[str, object], *, warmup: int, repeats: int
) -> ProfilePoint | None:
    times: list[float] = []
    items = 0
    base = memory_reset(device)
    try:
        for i in range(warmup + repeats):
            task.workload.restore(dict(snapshot))  # every step measures the same batch
            t0 = time.perf_counter()
            items = int(task.workload.step(bs))
            device_sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    except torch.OutOfMemoryError:
        log.info("profile %s: batch %d ran out of device memory", task.spec.name, bs)
        return None
    if items <= 0:
        return None
    peak = memory_peak(device, base)
    return ProfilePoint(bs, statistics.median(times), peak, items if items != bs else None)
