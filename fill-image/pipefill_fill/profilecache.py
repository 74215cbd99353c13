"""The profile cache, shared by every job of a workload (issue #30): a new FillJob of a model profiled before starts
filling at once from the cached profile instead of spending a second or two of bubbles measuring it again.

A profile is keyed by what decides its cost, nothing job-specific:

* the workload: its kind, builtin / entry point / import path, parameters, and the identity of its code (the class's
  module and name and a digest of the module's source file: a changed image or user code is a new key);
* the device (:func:`device_key`: the model and memory of the GPU, or the CPU and torch's thread count) and torch's
  version; a profile taken on another device kind is never used.

Where: ``PIPEFILL_FILL_PROFILE_DIR``; else ``<fill storage>/.pipefill/profiles`` when the training job's fill storage
is mounted (``PIPEFILL_FILL_STORAGE_DIR``: every rank pod of the job sees it); else a directory under the system's
temporary directory (every job of this executor, and of the executors beside it on the machine). ``pipefill local``
sets it to ``<run>/filljobs/profiles``, shared by all ranks of the run.

What is job-specific stays right: each record keeps the memory budget it was measured under and whether the job's
size cut it short. A job with a smaller budget uses the points that fit; one with a larger budget measures again when
the record stopped at its budget; an inference profile cut short by a small job (a batch larger than its samples
left) serves only jobs whose slice is no larger, and a larger job measures again and replaces it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipefill import env
from pipefill.plan import ProfilePoint
from pipefill_fill.atomic import atomic_write_bytes
from pipefill_fill.task import FillTask

__all__ = [
    "Profile",
    "device_key",
    "load_cached",
    "partial_points",
    "profile_dir",
    "store_profile",
    "store_unfinished",
    "workload_key",
]


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


def profile_dir() -> Path:
    """Where the cache is (see the module's docstring)."""
    if explicit := os.environ.get(env.FILL_PROFILE_DIR):
        return Path(explicit)
    if storage := os.environ.get(env.FILL_STORAGE_DIR):
        return Path(storage) / ".pipefill" / "profiles"
    return Path(tempfile.gettempdir()) / f"pipefill-profiles-{os.getuid()}"


@functools.cache  # per class object: changed code is a new class (a new process, or its module loaded again)
def _code_id(cls: type) -> str:
    """The workload class's module and name, and a digest of its module's source (a changed image or code)."""
    try:
        source = inspect.getsourcefile(cls)
        digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16] if source else "nosource"
    except (OSError, TypeError):
        digest = "nosource"
    return f"{cls.__module__}:{cls.__qualname__}#{digest}"


def workload_key(task: FillTask) -> str:
    """The workload part of the cache key: kind, name, parameters and the code's identity (not the job's name,
    size or output)."""
    spec = task.spec
    return f"{spec.kind}|{spec.workload_id}|{_code_id(type(task.workload))}"


def _cache_path(wkey: str, dkey: str) -> Path:
    digest = hashlib.sha256(f"{wkey}|{dkey}".encode()).hexdigest()[:24]
    return profile_dir() / f"profile-{digest}.json"


def _units_left(task: FillTask) -> int:
    return max(0, task.slice.end - task.progress)


def load_cached(task: FillTask, device: torch.device, *, memory_budget_bytes: int | None = None) -> Profile | None:
    """The cached profile of this (workload, device) usable by ``task``, or None (measure it)."""
    found = _read(task, device, memory_budget_bytes)
    if found is None:
        return None
    points, complete = found
    if not complete and task.spec.kind == "inference" and _units_left(task) > max(p.batch_size for p in points):
        return None  # a smaller job's profile: this one may run larger batches
    return Profile(task.spec.workload_id, device_key(device), tuple(points), cached=True)


def partial_points(
    task: FillTask, device: torch.device, *, memory_budget_bytes: int | None = None
) -> list[ProfilePoint]:
    """The sizes of a cached profile that a smaller job's work cut short (an incomplete inference record, which
    :func:`load_cached` does not give a larger job): measured already, so the larger job's profile goes on from the
    next larger candidate instead of measuring them again. Empty where there is none (issue #30: in a queue of jobs
    of 64-192 samples each job measured batch sizes 1 to 8 again and ran out of work before any profile was complete,
    so none was ever shared)."""
    found = _read(task, device, memory_budget_bytes)
    return found[0] if found is not None and not found[1] and task.spec.kind == "inference" else []


def store_unfinished(task: FillTask, device: torch.device, points: Sequence[ProfilePoint], *, budget: int) -> None:
    """A job let go of (its work done, stopped, failed) before its profile was complete: its full points are recorded
    as an incomplete profile for the next job of the workload to go on from (:func:`partial_points`). Only for
    inference (a training profile cut short is never cached: it would be taken for complete), and never over a record
    that is complete or has as many sizes (another executor's)."""
    shared = full_points(task, points)
    if task.spec.kind != "inference" or not shared:
        return
    found = _read(task, device, budget)
    if found is None or (not found[1] and len(found[0]) < len(shared)):
        store_profile(task, device, list(points), memory_budget_bytes=budget, stopped_by="work")


def _read(task: FillTask, device: torch.device, budget: int | None) -> tuple[list[ProfilePoint], bool] | None:
    """The cached record of this (workload, device): its points that fit ``budget``, and whether it is complete.
    None: no record, one measured under a smaller budget that stopped at it, or none of its points fits."""
    wkey, dkey = workload_key(task), device_key(device)
    try:
        data: dict[str, Any] = json.loads(_cache_path(wkey, dkey).read_text())
    except (OSError, ValueError):
        return None
    if data.get("workload_key") != wkey or data.get("device_key") != dkey:
        return None  # a digest collision, or a file from before the key
    points = [ProfilePoint(**{**p, "piece_s": tuple(p.get("piece_s") or ())}) for p in data.get("points") or ()]
    if budget is not None:
        if int(data.get("budget_bytes") or 0) < budget and data.get("stopped_by") == "memory":
            return None  # it stopped at a smaller budget than this job's: larger batches may fit here
        points = [p for p in points if p.peak_bytes <= budget]
    return (points, bool(data.get("complete", True))) if points else None


def full_points(task: FillTask, points: Sequence[ProfilePoint]) -> list[ProfilePoint]:
    """``points`` that measure their batch size: an inference point with fewer items than its batch was cut short by
    the job's samples left."""
    return [p for p in points if p.items_per_step is None or task.spec.kind != "inference"]


def store_profile(
    task: FillTask,
    device: torch.device,
    points: list[ProfilePoint],
    *,
    memory_budget_bytes: int | None = None,
    stopped_by: str = "",
) -> Profile:
    """Record ``points`` for every job of the workload; returns the job's own profile (every point it measured).

    Only full batches are shared: an inference point with fewer items than its batch size was cut short by this job's
    samples left, so the record is marked incomplete (it serves jobs no larger than its largest full batch), as is one
    whose slice ran out of work before every size was measured (``stopped_by`` "work")."""
    wkey, dkey = workload_key(task), device_key(device)
    shared = full_points(task, points)
    complete = True
    if task.spec.kind == "inference":
        complete = len(shared) == len(points) and not any(p.items_per_step for p in points)
    if stopped_by == "work":  # the slice ran out of work before the larger sizes were measured
        complete = False
    if shared:
        record = {
            "workload_key": wkey,
            "device_key": dkey,
            "workload_id": task.spec.workload_id,
            "measured_by": task.spec.name,
            "measured_unix_s": round(time.time(), 3),
            "budget_bytes": memory_budget_bytes,
            "stopped_by": stopped_by,
            "complete": complete,
            "points": [
                {
                    "batch_size": p.batch_size,
                    "step_s": p.step_s,
                    "peak_bytes": p.peak_bytes,
                    "items_per_step": p.items_per_step,
                    **({"piece_s": list(p.piece_s)} if p.piece_s else {}),
                }
                for p in shared
            ],
        }
        with contextlib.suppress(OSError):  # a read-only or full cache costs the next job a profile, nothing more
            atomic_write_bytes(_cache_path(wkey, dkey), (json.dumps(record, indent=2) + "\n").encode(), durable=False)
    return Profile(task.spec.workload_id, dkey, tuple(points))
