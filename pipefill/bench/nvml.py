"""GPU utilization as NVML reports it, sampled beside a benchmark run and averaged over its measured windows.

NVML's utilization is the fraction of a recent sample period (1/6 s to 1 s, by GPU) during which a kernel ran on the
device: the figure ``nvidia-smi`` and DCGM's dashboards show, and what a user compares with and without fill. It is
coarse (one kernel running counts as busy, however few multiprocessors it uses), so it says whether the device had
work, not how much of it was used. Sampled every :data:`PERIOD_S` on a thread of the benchmark's own process, each
sample stamped with ``time.monotonic_ns()`` (the clock of the trainers' event logs), so the samples inside a run's
measured steps, or inside a blocked run's A and B blocks, are averaged separately.

The core stays free of NVML: ``pynvml`` (nvidia-ml-py) is imported only when a run asks for a sampler on a GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any

__all__ = ["PERIOD_S", "UtilizationSampler", "mean_inside"]

PERIOD_S = 0.05
"""seconds between samples: several per NVML sample period, so a window of a few steps holds some"""


class UtilizationSampler:
    """``with UtilizationSampler(uuid) as s: …`` samples the GPU's utilization (0–1) until the block ends; ``s.samples``
    holds ``(monotonic_ns, utilization)``. ``s.error`` says why there are none (no NVML, the GPU not found)."""

    def __init__(self, gpu: int | str = 0, *, period_s: float = PERIOD_S) -> None:
        self.gpu, self.period_s = gpu, period_s
        self.samples: list[tuple[int, float]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> UtilizationSampler:
        try:
            import pynvml  # type: ignore[import-untyped]

            pynvml.nvmlInit()
            handle = (
                pynvml.nvmlDeviceGetHandleByUUID(self.gpu)
                if isinstance(self.gpu, str)
                else pynvml.nvmlDeviceGetHandleByIndex(self.gpu)
            )
        except Exception as exc:  # ImportError, NVMLError: no driver, no such GPU
            self.error = f"no NVML utilization ({type(exc).__name__}: {exc})"
            return self
        self._thread = threading.Thread(target=self._run, args=(pynvml, handle), name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self, pynvml: Any, handle: Any) -> None:
        try:
            while not self._stop.wait(self.period_s):
                self.samples.append((time.monotonic_ns(), pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0))
        except Exception as exc:  # the driver went away mid-run: keep what was sampled
            self.error = f"NVML sampling stopped ({type(exc).__name__}: {exc})"

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            try:
                import pynvml

                pynvml.nvmlShutdown()
            except Exception:  # shutting down what failed to start is nothing to report
                pass

    def mean(self, windows: Iterable[tuple[int, int]]) -> float | None:
        return mean_inside(self.samples, windows)


def mean_inside(samples: list[tuple[int, float]], windows: Iterable[tuple[int, int]]) -> float | None:
    """The mean of the samples stamped inside any of the ``[start_ns, end_ns)`` windows; None when none is."""
    spans = list(windows)
    inside = [u for t, u in samples if any(s <= t < e for s, e in spans)]
    return sum(inside) / len(inside) if inside else None
