"""What a wait point means on the device: the one place the trainer's CPU and GPU semantics differ (and the device's
memory a bubble offers and its UUIDs, which the channel publishes).

On CPU (gloo) compute runs on the calling thread, so when the CPU reaches a wait point the device (the core) has
done the rank's work, and ``Work.wait()`` blocks until the data is there: the bubble begins when the CPU gets there
and ends when ``wait()`` returns. :class:`BlockingSync` keeps exactly that (a blocked wait leaves the core to the
fill executor pinned beside the trainer; polling would take it).

On CUDA (NCCL) kernels are queued and the CPU runs ahead; ``Work.wait()`` only makes the current stream wait for the
NCCL op and returns at once (``TORCH_NCCL_BLOCKING_WAIT`` or a ``wait(timeout)`` would block, but by sleeping whole
milliseconds, and the former turns off NCCL's watchdog). :class:`CudaSync` gives the wait point its GPU meaning:

1. the receive is still pending when the CPU arrives: poll until the compute stream has run everything queued
   (a CUDA event recorded on it) or the receive completed (``Work.is_completed()`` queries the op's CUDA event);
   if the receive won, the GPU never idled: no bubble, and the CPU keeps its run-ahead;
2. else the GPU is idle now: the bubble begins; poll until the receive completed, then ``wait()`` orders the
   compute stream after it (no CPU block: the op is done).

Polling spins for :data:`SPIN_NS`, then sleeps between queries, the sleep doubling up to :data:`MAX_SLEEP_NS`: a
wait is noticed at most ~``MAX_SLEEP_NS`` plus the kernel's timer slack (50 µs) late, and a long wait costs a few
percent of one core instead of all of it (``cudaStreamSynchronize`` would spin under CUDA's default scheduling).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import torch
import torch.distributed as dist

__all__ = [
    "GPU_SAFETY_BYTES",
    "BlockingSync",
    "CudaSync",
    "DeviceSync",
    "Pending",
    "WorkPending",
    "device_sync",
    "device_uuids",
    "free_bytes_fn",
    "poll_until",
]

T = TypeVar("T", covariant=True)

SPIN_NS = 20_000
"""ns of back-to-back queries before the first sleep: a wait that ends within it is noticed at once"""
MIN_SLEEP_NS = 10_000
"""ns of the first sleep between queries; it doubles after each"""
MAX_SLEEP_NS = 100_000
"""ns the sleep between queries grows to: bounds how late a completion is noticed (plus ~50 µs timer slack)"""


class Pending(Protocol[T]):
    """A receive or collective in flight: ``done()`` never blocks, ``wait()`` returns its result."""

    def done(self) -> bool: ...

    def wait(self) -> T: ...


class WorkPending:
    """A ``torch.distributed`` :class:`~torch.distributed.Work` (e.g. ``all_reduce(..., async_op=True)``) as
    :class:`Pending`; NCCL's ``is_completed()`` is the GPU's completion of the op."""

    __slots__ = ("work",)

    def __init__(self, work: dist.Work) -> None:
        self.work = work

    def done(self) -> bool:
        return bool(self.work.is_completed())

    def wait(self) -> None:
        self.work.wait()


class DeviceSync(Protocol):
    def idle_before(self, pending: Pending[object]) -> bool:
        """At a wait point whose ``pending`` was not done when the CPU got there: return once the device has run all
        of this rank's queued work (True: still not done, the rank idles from now on — a bubble) or ``pending``
        completed first (False: the device never idled)."""

    def wait(self, pending: Pending[T]) -> T:
        """Until ``pending`` completed on the device; its result, later device work ordered after it."""

    def drain(self) -> None:
        """Until the device has run everything queued so far."""


def poll_until(
    ready: Callable[[], bool],
    *,
    spin_ns: int = SPIN_NS,
    min_sleep_ns: int = MIN_SLEEP_NS,
    max_sleep_ns: int = MAX_SLEEP_NS,
) -> None:
    """Return once ``ready()`` (cheap, non-blocking) is true: back-to-back queries for ``spin_ns``, then sleeps of
    ``min_sleep_ns`` doubling up to ``max_sleep_ns`` between them."""
    if ready():
        return
    spin_end_ns = time.monotonic_ns() + spin_ns
    while time.monotonic_ns() < spin_end_ns:
        if ready():
            return
    sleep_ns = min_sleep_ns
    while not ready():
        time.sleep(sleep_ns / 1e9)
        sleep_ns = min(2 * sleep_ns, max_sleep_ns)


class BlockingSync:
    """CPU: compute is synchronous, so the device is idle when the CPU reaches a wait point; block in ``wait()``."""

    def idle_before(self, pending: Pending[object]) -> bool:
        return True

    def wait(self, pending: Pending[T]) -> T:
        return pending.wait()

    def drain(self) -> None:
        pass


class CudaSync:
    """CUDA: a wait point is where the GPU idles, found by polling CUDA events (see the module docstring).

    Built without touching CUDA (importable and constructible anywhere). :meth:`idle_before` and :meth:`drain` use a
    CUDA event and raise ``RuntimeError`` on a machine without CUDA; :meth:`wait` only polls ``pending`` (so it can be
    tested against a gloo operation). A hung peer does not keep it polling for ever: NCCL's watchdog marks a timed-out
    operation completed with an error, which ``wait()`` then raises.
    """

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"CudaSync needs a cuda device, got {device}")
        self.device = device
        self._event: torch.cuda.Event | None = None  # reused: re-recording moves it to the stream's new end

    def _mark_stream_end(self) -> torch.cuda.Event:
        if self._event is None:
            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"CudaSync used for {self.device} on a machine without CUDA (torch {torch.__version__}); "
                    "set PIPEFILL_DEVICE=cpu or run on a GPU node"
                )
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self._event.record(torch.cuda.current_stream(self.device))
        return self._event

    def idle_before(self, pending: Pending[object]) -> bool:
        drained = self._mark_stream_end()
        poll_until(lambda: drained.query() or pending.done())  # type: ignore[no-untyped-call]
        return not pending.done()

    def wait(self, pending: Pending[T]) -> T:
        poll_until(pending.done)
        return pending.wait()

    def drain(self) -> None:
        poll_until(self._mark_stream_end().query)


def device_sync(device: torch.device) -> DeviceSync:
    """The wait-point strategy of ``device``: :class:`CudaSync` on cuda, :class:`BlockingSync` on cpu."""
    if device.type == "cuda":
        return CudaSync(device)
    if device.type == "cpu":
        return BlockingSync()
    raise ValueError(f"device {device}: the trainer runs on cpu or cuda (PIPEFILL_DEVICE)")


GPU_SAFETY_BYTES = 512 * 2**20
"""never offered: the trainer's allocator may still grow a little inside a bubble"""


def device_uuids(device: torch.device) -> list[str]:
    """UUIDs of the GPU the trainer uses (what the fill executor selects under visibleDevices); [] on CPU."""
    if device.type != "cuda":
        return []
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):
        return []
    return [uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"]


def free_bytes_fn(device: torch.device, *, reserved_bytes: int) -> Callable[[], int]:
    """The device memory a bubble offers: on CUDA what is free now less :data:`GPU_SAFETY_BYTES`; on CPU the
    configured budget (``spec.fill.reservedMemory``)."""
    if device.type != "cuda":
        return lambda: reserved_bytes

    def gpu_free() -> int:
        free, _ = torch.cuda.mem_get_info(device)
        return max(0, free - GPU_SAFETY_BYTES)

    return gpu_free
