"""The hypervisor's steal time on one core, sampled while a benchmark runs (``/proc/stat``, the ``steal`` column).

On a virtual machine the host may run something else on the vCPU that the fill's core is: the fill's step then
neither runs nor is preempted by anything the guest sees (its thread's CPU time stops, with no context switch), and
a bubble overruns by what was taken. ``pipefill bench fill`` found steps of 6–10 ms of CPU take 30–103 ms with two
context switches. Such an overrun is the machine's, not the fill's: the benchmark reports its overruns with and
without the bubbles during which the fill's core was stolen from, so a target is judged on what the fill does.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipefill.events import FillEvent
from pipefill.local.stats import overrun_summary

__all__ = ["StealSampler", "read_steal_ticks", "steal_summary"]

_STAT = Path("/proc/stat")
_STEAL_FIELD = 8  # cpuN user nice system idle iowait irq softirq steal ...


def read_steal_ticks(cpu: int, stat: Path = _STAT) -> int | None:
    """The steal time of core ``cpu`` so far, in clock ticks (``SC_CLK_TCK`` a second); None where the kernel does
    not report it."""
    try:
        text = stat.read_text()
    except OSError:
        return None
    prefix = f"cpu{cpu} "
    for line in text.splitlines():
        if line.startswith(prefix):
            fields = line.split()
            return int(fields[_STEAL_FIELD]) if len(fields) > _STEAL_FIELD else None
    return None


class StealSampler:
    """Samples core ``cpu``'s steal time every ``interval_s`` on a thread of its own, pinned to ``sampler_cpus`` (not
    the measured core, which it would otherwise take from the fill); :meth:`stolen_ms` says how much was stolen
    around an interval. A sample is kept only when the count moved, so a long run keeps few."""

    def __init__(
        self, cpu: int, *, sampler_cpus: set[int] | None = None, interval_s: float = 0.005, stat: Path = _STAT
    ) -> None:
        self.cpu, self.interval_s, self.stat = cpu, interval_s, stat
        self.sampler_cpus = sampler_cpus
        self.tick_ms = 1e3 / os.sysconf("SC_CLK_TCK")
        self.times: list[int] = []  # monotonic ns of each kept sample
        self.ticks: list[int] = []  # the steal count then
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steal-sampler", daemon=True)
        self.available = read_steal_ticks(cpu, stat) is not None

    def add(self, t_ns: int, ticks: int) -> None:
        """A sample: at ``t_ns`` the count was ``ticks`` (kept when it moved, and the first)."""
        if not self.ticks or ticks != self.ticks[-1]:
            self.times.append(t_ns)
            self.ticks.append(ticks)

    def start(self) -> StealSampler:
        if self.available:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        if self.sampler_cpus:
            os.sched_setaffinity(0, self.sampler_cpus)  # this thread only
        while not self._stop.is_set():
            ticks = read_steal_ticks(self.cpu, self.stat)
            if ticks is not None:
                self.add(time.monotonic_ns(), ticks)
            self._stop.wait(self.interval_s)

    def total_ms(self) -> float:
        return (self.ticks[-1] - self.ticks[0]) * self.tick_ms if self.ticks else 0.0

    def count_at(self, t_ns: int) -> int:
        """The steal count as sampled at ``t_ns`` (the first sample's before it)."""
        i = bisect.bisect_right(self.times, t_ns) - 1
        return self.ticks[max(i, 0)]

    def stolen_ms(self, start_ns: int, end_ns: int) -> float:
        """Steal time counted from ``start_ns`` to ``end_ns``, and two sample intervals after it (a change is seen up
        to an interval late). The count moves in whole ticks: a steal shorter than a tick may show in the next
        interval's, or not at all."""
        if not self.ticks:
            return 0.0
        grace_ns = int(2 * self.interval_s * 1e9)
        return max(0, self.count_at(end_ns + grace_ns) - self.count_at(start_ns)) * self.tick_ms


def steal_summary(sampler: StealSampler, bubbles: Sequence[FillEvent]) -> dict[str, Any]:
    """The run's steal on the fill's core (``available``: the kernel reports it), how many of the bubbles worked in
    saw some from the fill's wake-up to its yield (and how many of those overran past the guard), and the overruns
    of the others (p99, max: what the fill does where the machine took nothing)."""
    worked = [b for b in bubbles if b.steps]
    hit = {b.id for b in worked if sampler.stolen_ms(b.woke_ns, b.yielded_ns) > 0}
    clean = overrun_summary(b for b in worked if b.id not in hit)
    return {
        "available": sampler.available,
        "total_ms": round(sampler.total_ms(), 1),
        "bubbles": len(hit),
        "past_guard": sum(1 for b in worked if b.id in hit and b.overrun_cause),
        "overrun_p99_ms_without": clean["overrun_p99_ms"],
        "overrun_max_ms_without": clean["overrun_max_ms"],
    }
