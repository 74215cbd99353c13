"""Attach to the device: the trainer's GPU (by the UUIDs it publishes on the channel) or the CPU, CPU pinning, the
allocator cap that keeps the fill within its memory budget, and how much memory the fill holds."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from pipefill import env

__all__ = [
    "autogroup_on",
    "cap_memory",
    "device_sync",
    "idle_priority",
    "memory_in_use",
    "memory_peak",
    "memory_reset",
    "parse_cpu_list",
    "pin_cpus",
    "proc_status_kb",
    "select_device",
    "step_clock",
]

log = logging.getLogger("pipefill_fill")


def parse_cpu_list(text: str) -> set[int]:
    """``"0"``, ``"0,2"`` or ``"0-3,6"`` → a set of CPU numbers; errors name the variable."""
    return env.cpu_list(text)


def pin_cpus(text: str | None) -> set[int] | None:
    """Pin this process to the CPUs in ``text`` (the trainer's core on CPU runs) and use one torch thread per core."""
    if not text:
        return None
    cpus = parse_cpu_list(text)
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))
    return cpus


def idle_priority() -> bool:
    """Put this process at the kernel's idle scheduling policy (SCHED_IDLE; threads started later inherit it): it
    runs only when nothing of normal priority wants the core, and a waking trainer preempts it at once. False, with
    a warning, where the kernel refuses (the fill then competes with its trainer for the core).

    The kernel ranks threads by that policy within their scheduling group only: a cgroup, or with autogroup
    (``kernel.sched_autogroup_enabled``) in the root cgroup a session. An executor that leads a session of its own
    there is a group of its own, its trainer's equal; its group then takes the lowest weight (:func:`_session_last`)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError) as exc:
        log.warning("cannot take the idle CPU priority (%s): the fill competes with its trainer for the core", exc)
        return False
    if _session_last():
        log.info("leading a session of its own under autogroup: its session's group set to nice 19")
    return True


AUTOGROUP_ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")


def _session_last() -> bool:
    """With autogroup on, a process that leads its session (started by ``setsid``, as many launchers do) sets its
    session's group to nice 19 (``/proc/self/autogroup``): weight 15 against a trainer's 1024, about 1.5 % of a core
    both want, where its own group would get half. Only as the session's leader, so that it never lowers another
    process's group (a shell's, a launcher's, its trainer's). Whether it did."""
    if not autogroup_on() or os.getsid(0) != os.getpid():
        return False
    try:
        Path("/proc/self/autogroup").write_text("19", encoding="ascii")
    except OSError:
        return False
    return True


def autogroup_on() -> bool:
    """Whether this kernel groups threads by session (autogroup); False where it cannot tell."""
    try:
        return AUTOGROUP_ENABLED.read_text(encoding="ascii").strip() == "1"
    except OSError:
        return False


def step_clock(device: torch.device, *, idle: bool) -> Callable[[], int]:
    """The clock (ns) a fill step's cost is measured with, for its profile and its time model: wall time, except on
    the CPU at idle priority, where a step that the trainer preempted (its bubble ended early) or other work on the
    core delayed took longer in wall time than it costs; there this thread's CPU time (one torch thread: the step's
    work is on it) is what the step needs of an idle core."""
    if device.type == "cpu" and idle:
        return time.thread_time_ns
    return time.monotonic_ns


def select_device(requested: str | None, trainer_gpu_uuids: Sequence[str] = ()) -> torch.device:
    """The device to run on.

    ``requested`` is ``PIPEFILL_DEVICE`` ("cpu", "cuda", "cuda:N"; unset: cuda when available). For "cuda" without an
    index, the GPU whose UUID the trainer published is chosen (the fallback sharing mode sees all of the node's GPUs);
    without published UUIDs, the current CUDA device.
    """
    choice = (requested or ("cuda" if torch.cuda.is_available() else "cpu")).strip()
    if choice == "cpu":
        return torch.device("cpu")
    if not choice.startswith("cuda"):
        raise ValueError(f"{env.DEVICE}={requested!r}: expected cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(
            f"{env.DEVICE}={requested!r}: CUDA is not available in this container; use cpu or expose a GPU"
        )
    if ":" in choice:
        return torch.device(choice)
    wanted = {_norm_uuid(u) for u in trainer_gpu_uuids if u}
    if wanted:
        for idx in range(torch.cuda.device_count()):
            if _norm_uuid(str(torch.cuda.get_device_properties(idx).uuid)) in wanted:
                return torch.device("cuda", idx)
        raise ValueError(
            f"the trainer's GPU {sorted(wanted)} is not visible to the fill executor "
            f"({torch.cuda.device_count()} visible); check NVIDIA_VISIBLE_DEVICES or the shared ResourceClaim"
        )
    return torch.device("cuda", torch.cuda.current_device())


def cap_memory(device: torch.device, budget_bytes: int) -> float | None:
    """Cap the caching allocator at ``budget_bytes`` on a GPU; returns the fraction set (None on CPU)."""
    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = max(0.0, min(1.0, budget_bytes / total))
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def memory_in_use(device: torch.device) -> Callable[[], int]:
    """A reading of the device memory the fill's work holds now (what the trainer cannot use). On CUDA what this
    process's caching allocator has reserved on the device (NVML's per-device figure cannot tell the two containers
    apart). On CPU the growth of the process's resident set (``VmRSS``) since this call, made once the executor has
    started and before it takes work: the same measure as the profiler's peak (the interpreter and torch, some
    400 MB, are not the work's and are left out), and what ``PIPEFILL_FILL_RESERVED_BYTES`` bounds there."""
    if device.type == "cuda":
        return lambda: int(torch.cuda.memory_reserved(device))
    base_bytes = proc_status_kb("VmRSS") * 1024
    return lambda: max(0, proc_status_kb("VmRSS") * 1024 - base_bytes)


def proc_status_kb(key: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``); OSError where Linux does not offer it."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {key}")


def _norm_uuid(text: str) -> str:
    return text.lower().removeprefix("gpu-").replace("-", "")


def device_sync(device: torch.device) -> None:
    """Wait for the device's queued work (a step's end is when the device is free again); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_reset(device: torch.device) -> int:
    """Start measuring a step's peak memory: on CUDA the allocator's peak is reset (0 returned); on the CPU the
    process's resident high-water mark is reset to its resident set, which is returned (bytes; -1: Linux does not
    offer it)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return 0
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        return proc_status_kb("VmRSS") * 1024
    except OSError:
        return -1


def memory_peak(device: torch.device, base: int) -> int:
    """The peak memory (bytes) since :func:`memory_reset` returned ``base``: the allocator's peak on CUDA, the growth
    of the resident high-water mark on the CPU (0 where it is not offered)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if base < 0:
        return 0
    return max(0, proc_status_kb("VmHWM") * 1024 - base)
