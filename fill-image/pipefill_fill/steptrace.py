"""Where a fill step's time went, for the bubble's record: the host part, the filling thread's CPU, its switches and
page faults.

A step that runs past its prediction overruns the bubble, and its cause ``step`` alone does not say what to do about
it. Three readings, taken around every step for about a microsecond each, tell the cases apart:

* ``host_us`` — the step's call until it returned, before the device was synchronized (on a CPU: the whole step);
  the rest of the span is the wait for the device's queue to drain;
* ``cpu_us`` — the filling thread's own CPU time during the step (``CLOCK_THREAD_CPUTIME_ID``). Much less than the
  span with few switches: it waited on the device (a synchronization that sleeps). Much less with switches: it
  waited for something else;
* ``switches`` — the filling thread's context switches during the step (``getrusage(RUSAGE_THREAD)``): voluntary (it
  blocked: the GIL held by another thread, a lock, a sleeping synchronization) and involuntary (the kernel took the
  core for another thread);
* ``faults`` — the filling thread's page faults during the step (the same call: minor and major): memory the step
  touched that was not mapped, such as an allocation the allocator had given back to the kernel. The whole-life
  matrix found single steps whose own CPU time was twice their size's (session 34); faults are CPU time the thread
  spends in the kernel, and one candidate.

So a late step whose span is host time at full CPU was slow Python or a slow call (an allocation, a kernel chosen
for a new shape); one with involuntary switches lost its core; one with voluntary switches and little CPU waited for
the GIL or a lock; one whose span is mostly after the host part waited for the device.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

__all__ = ["Mark", "StepTrace", "mark"]


@dataclass(frozen=True, slots=True)
class Mark:
    cpu_ns: int
    voluntary: int
    involuntary: int
    faults: int = 0


def mark() -> Mark:
    """The filling thread's CPU time, context-switch and page-fault counts now."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return Mark(time.thread_time_ns(), usage.ru_nvcsw, usage.ru_nivcsw, usage.ru_minflt + usage.ru_majflt)


@dataclass(frozen=True, slots=True)
class StepTrace:
    """One step's readings (see the module docstring); microseconds."""

    host_us: int
    cpu_us: int
    voluntary: int
    involuntary: int
    faults: int = 0

    @classmethod
    def between(cls, before: Mark, after: Mark, *, host_ns: int) -> StepTrace:
        return cls(
            host_us=host_ns // 1000,
            cpu_us=(after.cpu_ns - before.cpu_ns) // 1000,
            voluntary=after.voluntary - before.voluntary,
            involuntary=after.involuntary - before.involuntary,
            faults=after.faults - before.faults,
        )

    def row(self) -> tuple[int, int, int, int, int]:
        """As the ``fill`` record's ``step_trace`` holds it: [host µs, CPU µs, voluntary, involuntary switches, page
        faults]."""
        return (self.host_us, self.cpu_us, self.voluntary, self.involuntary, self.faults)
