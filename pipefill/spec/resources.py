"""What each rank's pod gets: resources, how trainer and fill share the GPU, and the fill's own settings."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from pipefill.spec._schema import Rule, field
from pipefill.spec.common import LabelSelector
from pipefill.spec.immutable import immutable

__all__ = ["DEFAULT_FILL_STORAGE_MOUNT", "FillSettings", "FillStorage", "GpuSharing", "Mps", "Resources", "SharingMode"]


class SharingMode(enum.StrEnum):
    DRA = "dra"
    VISIBLE_DEVICES = "visibleDevices"
    NONE = "none"


@dataclass
class Resources:
    """Resources of each rank's pod."""

    gpus: int = field(doc="GPUs per rank; 0 trains on CPU.", minimum=0, maximum=16, default=1)
    gpu_resource_name: str = field(
        doc="Extended resource of the device plugin.", max_length=253, default="nvidia.com/gpu"
    )
    cpu: int | str = field(
        doc="CPU request of the trainer container (Kubernetes quantity).", quantity=True, default="4"
    )
    memory: int | str = field(
        doc="Memory request of the trainer container (Kubernetes quantity).", quantity=True, default="16Gi"
    )


@dataclass
class Mps:
    """NVIDIA MPS: fill kernels run beside the trainer's instead of time-slicing with them."""

    enabled: bool = field(doc="Run the fill executor as an MPS client.", default=False)
    fill_client_priority: int = field(
        doc="CUDA_MPS_CLIENT_PRIORITY of the fill (1 = below normal).", minimum=0, maximum=1, default=1
    )
    fill_active_thread_percentage: int = field(
        doc="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of the fill.", minimum=1, maximum=100, default=100
    )
    fill_pinned_memory_limit: int | str | None = field(
        doc="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT of the fill (quantity); default: fill.reservedMemory.",
        quantity=True,
        default=None,
    )


@dataclass
class GpuSharing:
    """How the trainer and the fill executor share the rank's GPU."""

    mode: SharingMode = field(
        doc="dra: one ResourceClaim for both containers; visibleDevices: fill selects the trainer's GPU by UUID; none: fill on CPU only.",
        default=SharingMode.DRA,
    )
    device_class_name: str = field(doc="DRA DeviceClass to claim from.", max_length=253, default="gpu.nvidia.com")
    mps: Mps = field(doc="MPS options.", default_factory=lambda: Mps())

    __rules__: ClassVar[tuple[Rule, ...]] = (
        immutable(
            "mode",
            path="spec.gpuSharing.mode",
            why="the job's ResourceClaimTemplate (mode dra) is made, or not, when it first starts",
        ),
        immutable(
            "deviceClassName",
            path="spec.gpuSharing.deviceClassName",
            why="the job's ResourceClaimTemplate claims from it, made when the job first starts",
            when="self.mode == 'dra'",
        ),
        immutable(
            "mps.enabled",
            path="spec.gpuSharing.mps.enabled",
            why="the job's ResourceClaimTemplate asks for MPS, or not, made when the job first starts",
            when="self.mode == 'dra'",
        ),
    )


DEFAULT_FILL_STORAGE_MOUNT = "/fill-storage"


@dataclass
class FillStorage:
    """Shared storage of the fill jobs this training job hosts: a ReadWriteMany claim in every fill sidecar."""

    claim_name: str = field(
        doc="PersistentVolumeClaim (ReadWriteMany: every rank pod mounts it) holding FillJob inputs and outputs; a "
        "FillJob whose output.claimName is this claim may run here.",
        max_length=253,
        pattern="^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
    )
    mount_path: str = field(
        doc="Where the fill sidecar mounts it (PIPEFILL_FILL_STORAGE_DIR); FillJob paths are relative to it.",
        max_length=4096,
        pattern="^/.*",
        default=DEFAULT_FILL_STORAGE_MOUNT,
    )

    __rules__: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="!(self.mountPath in ['/', '/dev/shm', '/tmp', '/home/pipefill', '/run/pipefill', '/workspace'])",
            message="spec.fill.storage.mountPath must not be a path the fill sidecar mounts already (/, /dev/shm, "
            "/tmp, /home/pipefill, /run/pipefill, /workspace); use e.g. /fill-storage",
            field_path=".mountPath",
        ),
    )


@dataclass
class FillSettings:
    """How bubbles are offered to fill work."""

    enabled: bool = field(doc="Run the fill executor and announce bubbles.", default=True)
    reserved_memory: int | str = field(
        doc="Device memory kept free for fill work (quantity).", quantity=True, default="2Gi"
    )
    min_bubble_milliseconds: float | None = field(
        doc="Bubbles shorter than this are not announced; unset: the fill's own floor, measured (its wake-up, the "
        "guard and its smallest step or piece), 5 ms until it has one.",
        unit="ms",
        minimum=0,
        maximum=60000,
        default=None,
    )
    guard_milliseconds: float = field(
        doc="The fill must yield this long before a bubble's expected end.",
        unit="ms",
        minimum=0,
        maximum=60000,
        default=1.0,
    )
    cpu: int | str = field(
        doc="CPU request of the fill-executor sidecar (quantity); it mostly waits on the channel, but plans, loads "
        "inputs and commits progress on the CPU.",
        quantity=True,
        default="1",
    )
    memory: int | str = field(
        doc="Memory request of the fill-executor sidecar (quantity): host memory for its workload, inputs and its "
        "own /dev/shm.",
        quantity=True,
        default="4Gi",
    )
    job_selector: LabelSelector = field(
        doc="Which FillJobs (by their labels) this job hosts; empty: all FillJobs of its namespace that select it.",
        default_factory=lambda: LabelSelector(),
    )
    storage: FillStorage | None = field(
        doc="Shared fill storage; FillJobs on another claim (or on none, when this is set) never run here.",
        default=None,
    )
