"""The environment contract between the operator (or ``pipefill local``) and the two containers of a rank's pod.

One place names every variable, so the pod builder, the local runner, the trainer and the fill executor agree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TypeVar

__all__ = [
    "AUTO_MIN_BUBBLE_MS",
    "BASELINE_EVERY_STEPS",
    "CHANNEL_DIR",
    "COMM_TIMEOUT_S",
    "CPU_AFFINITY",
    "DEFAULT_CHANNEL_DIR",
    "DEFAULT_FILL_MAX_ACTIVE_JOBS",
    "DEVICE",
    "EXIT_INVALID_CONFIG",
    "EXIT_OK",
    "EXIT_PEER_FAILED",
    "EXIT_RETRYABLE",
    "FILL_CONTINUE_PIECE_US",
    "FILL_CPU_PRIORITY",
    "FILL_END_QUANTILE",
    "FILL_GUARD_MS",
    "FILL_MAX_ACTIVE_JOBS",
    "FILL_MIN_BUBBLE_MS",
    "FILL_OFFLOAD",
    "FILL_OVERRUN_BUDGET_US",
    "FILL_PROFILE_DIR",
    "FILL_RESERVED_BYTES",
    "FILL_SPIN_US",
    "FILL_SPLIT_ABOVE_US",
    "FILL_STORAGE_DIR",
    "JOB_NAME",
    "LOCAL_PRELOAD",
    "LOG_LEVEL",
    "METRICS_PORT",
    "MODEL_CODE_DIR",
    "OUT_DIR",
    "PARENT_PID",
    "POD_NAMESPACE",
    "POD_UID",
    "RANK",
    "SCHEDULE_FILE",
    "SPEC_FILE",
    "TRAINER_LATE_ANNOUNCE_US",
    "WORK_SOURCE",
    "cpu_list",
    "env_float",
    "env_int",
    "fill_max_active_jobs",
    "min_bubble_s",
]

_N = TypeVar("_N", int, float)

DEFAULT_CHANNEL_DIR = "/run/pipefill"
"""Where both containers mount the memory-backed emptyDir of the bubble channel; ``CHANNEL_DIR`` overrides it."""

# Both containers
CHANNEL_DIR = "PIPEFILL_CHANNEL_DIR"  # directory of the bubble channel (memory-backed emptyDir); default /run/pipefill
JOB_NAME = "PIPEFILL_JOB_NAME"  # the PipelineTrainingJob's name
RANK = "PIPEFILL_RANK"  # this pod's global rank (replica × stages + stage): the fill executor's identity
METRICS_PORT = "PIPEFILL_METRICS_PORT"  # Prometheus port of this container; 0 disables the endpoint
PARENT_PID = "PIPEFILL_PARENT_PID"  # set by pipefill local: the process gets SIGTERM when that parent dies
CPU_AFFINITY = "PIPEFILL_CPU_AFFINITY"  # CPU list ("0" or "0,1") to pin the process to; unset: no pinning
DEVICE = "PIPEFILL_DEVICE"  # "cpu", "cuda" or "cuda:N"; unset: cuda when available, else cpu
OUT_DIR = "PIPEFILL_OUT_DIR"  # where a container writes its event log and trace (local runs and debugging)
LOCAL_PRELOAD = "PIPEFILL_LOCAL_PRELOAD"  # pipefill local: "0": each child imports torch itself (launcher.py)
LOG_LEVEL = "PIPEFILL_LOG_LEVEL"  # the fill executor's logging level (DEBUG, INFO, WARNING, ERROR); default INFO

# Trainer container only (plus torch.distributed's own RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
SPEC_FILE = "PIPEFILL_SPEC_FILE"  # the PipelineTrainingJob manifest (YAML), mounted from a ConfigMap
TRAINER_LATE_ANNOUNCE_US = "PIPEFILL_TRAINER_LATE_ANNOUNCE_US"  # a wait not announced, still going after this: announced late; 0: never (trainer.md)
MODEL_CODE_DIR = "PIPEFILL_MODEL_CODE_DIR"  # spec.model.python.code's module files (a mounted ConfigMap or a
# directory on the fill storage); unset: the function's module is importable in the trainer image
SCHEDULE_FILE = "PIPEFILL_SCHEDULE_FILE"  # CSV of schedule custom; default: customSchedule.key beside SPEC_FILE
COMM_TIMEOUT_S = "PIPEFILL_COMM_TIMEOUT_S"  # seconds a rank waits on a silent peer before exiting 75; default 300
BASELINE_EVERY_STEPS = "PIPEFILL_BASELINE_EVERY_STEPS"  # one step in this many announces no bubble (the no-fill
# baseline, docs/metrics.md); default 50, 0: never

# Fill-executor container only
WORK_SOURCE = "PIPEFILL_WORK_SOURCE"  # "files:<dir>" (pipefill local) or "kubernetes" (FillJobs assigned to this pod)
FILL_RESERVED_BYTES = "PIPEFILL_FILL_RESERVED_BYTES"  # device memory the fill may use, bytes (spec.fill.reservedMemory)
FILL_MIN_BUBBLE_MS = "PIPEFILL_FILL_MIN_BUBBLE_MS"  # spec.fill.minBubbleMilliseconds
FILL_GUARD_MS = "PIPEFILL_FILL_GUARD_MS"  # spec.fill.guardMilliseconds
FILL_OFFLOAD = "PIPEFILL_FILL_OFFLOAD"  # "1": keep fill state in pinned host memory between bubbles (GPU); default off
FILL_END_QUANTILE = "PIPEFILL_FILL_END_QUANTILE"  # where a bubble is planned to end (fill.md, the end model)
FILL_OVERRUN_BUDGET_US = "PIPEFILL_FILL_OVERRUN_BUDGET_US"  # expected overrun a step may have, µs (fill.md); default 50
FILL_CONTINUE_PIECE_US = "PIPEFILL_FILL_CONTINUE_PIECE_US"  # continuation past a bubble's planned end while it is open: the longest piece it may start, µs; 0 (default): never
FILL_SPLIT_ABOVE_US = "PIPEFILL_FILL_SPLIT_ABOVE_US"  # a step predicted longer than this runs in pieces where the workload has them, µs; default 2000; 0: never
FILL_CPU_PRIORITY = "PIPEFILL_FILL_CPU_PRIORITY"  # "idle" or "normal"; default idle when pinned to the trainer's core
FILL_SPIN_US = "PIPEFILL_FILL_SPIN_US"  # spin window around each predicted bubble, µs; 0 (default): never spin
FILL_STORAGE_DIR = "PIPEFILL_FILL_STORAGE_DIR"  # mount of the training job's fill storage (spec.fill.storage); FillJob paths on it are relative to it
FILL_PROFILE_DIR = "PIPEFILL_FILL_PROFILE_DIR"  # the profile cache every executor of the pool shares (fill.md, "The profile cache"); default: <fill storage>/.pipefill/profiles, else a temporary directory
POD_NAMESPACE = "POD_NAMESPACE"  # the pod's namespace (downward API): where the Kubernetes work source finds FillJobs
POD_UID = "PIPEFILL_POD_UID"  # the pod's metadata.uid (downward API): the executor's identity in FillJob assignments

# Fill executor and operator both
FILL_MAX_ACTIVE_JOBS = "PIPEFILL_FILL_MAX_ACTIVE_JOBS"
"""FillJobs one rank's executor works on at once (one more while a job's last commit is being written: the next one
is prepared meanwhile, fill.md "Switches between jobs"), and so the most the operator's queue assigns to one rank pod
(one more while a job there is expected to finish within 30 s: ``pipefill.queue.state.FINISHING_LEAD_S``);
default :data:`DEFAULT_FILL_MAX_ACTIVE_JOBS`. More jobs per rank let a job use bubble classes another cannot, but a
job that shares its only class with another waits for it."""
DEFAULT_FILL_MAX_ACTIVE_JOBS = 2

# Trainer exit codes; the operator restarts the job on the retryable ones (spec.runPolicy.restartOnExitCodes).
EXIT_OK = 0
EXIT_INVALID_CONFIG = 2  # permanent: the spec or the environment can never work
EXIT_RETRYABLE = 75  # EX_TEMPFAIL: transient (a peer died, a rendezvous timed out); restart from the checkpoint
EXIT_PEER_FAILED = EXIT_RETRYABLE


def _env_number(name: str, default: _N, parse: Callable[[str], _N], what: str, environ: Mapping[str, str] | None) -> _N:
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or raw == "":
        return default
    try:
        return parse(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be {what}") from None


def env_int(name: str, default: int, *, environ: Mapping[str, str] | None = None) -> int:
    """An integer environment variable (of ``environ``, default ``os.environ``); the error names it."""
    return _env_number(name, default, int, "an integer", environ)


def env_float(name: str, default: float, *, environ: Mapping[str, str] | None = None) -> float:
    """A number environment variable (of ``environ``, default ``os.environ``); the error names it."""
    return _env_number(name, default, float, "a number", environ)


AUTO_MIN_BUBBLE_MS = 5.0
"""With spec.fill.minBubbleMilliseconds unset: the announcement floor while the fill has not said its own (and what
the fill queue plans with; the fill's floor, once measured, replaces it in the trainer)"""


def min_bubble_s(environ: Mapping[str, str] | None = None) -> float | None:
    """:data:`FILL_MIN_BUBBLE_MS` of ``environ`` in seconds; None where it is unset or empty (the spec leaves
    ``spec.fill.minBubbleMilliseconds`` out: the fill's own floor decides)."""
    e = os.environ if environ is None else environ
    if not e.get(FILL_MIN_BUBBLE_MS, ""):
        return None
    value = env_float(FILL_MIN_BUBBLE_MS, 0.0, environ=e)
    if value < 0:
        raise ValueError(
            f"environment variable {FILL_MIN_BUBBLE_MS}={value:g} must be ≥ 0 milliseconds; unset it for the fill's "
            "own floor"
        )
    return value / 1000


def fill_max_active_jobs(environ: Mapping[str, str] | None = None) -> int:
    """:data:`FILL_MAX_ACTIVE_JOBS` of ``environ`` (default ``os.environ``): the executor's and the queue's limit."""
    value = env_int(FILL_MAX_ACTIVE_JOBS, DEFAULT_FILL_MAX_ACTIVE_JOBS, environ=environ)
    if value < 1:
        raise ValueError(
            f"environment variable {FILL_MAX_ACTIVE_JOBS}={value} must be ≥ 1 fill job per rank; unset it for the "
            f"default {DEFAULT_FILL_MAX_ACTIVE_JOBS}"
        )
    return value


def cpu_list(text: str) -> set[int]:
    """``"0"``, ``"0,2"`` or ``"0-3,6"`` (the ``PIPEFILL_CPU_AFFINITY`` grammar) → a set of CPU numbers."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-", 1)
                cpus.update(range(int(lo), int(hi) + 1))
            elif part:
                cpus.add(int(part))
    except ValueError:
        cpus = set()
    if not cpus or min(cpus) < 0:
        raise ValueError(f"{CPU_AFFINITY}={text!r}: expected a CPU list such as 0, 0,2 or 0-3")
    return cpus
