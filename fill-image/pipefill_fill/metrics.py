"""The fill executor's Prometheus metrics (``pipefill_fill_*``); the registry is passed in so tests use their own.

Label values: ``fill_job`` (FillJob names; not ``job``, which Prometheus sets itself), ``batch_size``, and
``reason`` from :data:`SKIP_REASONS` (all pre-initialised, so a rate over them starts at 0, not at the first skip).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["OVERRUN_CAUSES", "RETAIN_S", "SKIP_REASONS", "FillMetrics"]

RETAIN_S = 600.0
"""seconds a job's series stay after the executor let go of it: Prometheus scrapes their last values (a counter that
vanishes at once hides its last increments from ``rate()``), then they go, so a long queue of small FillJobs does not
grow the executor's series without bound"""

SKIP_REASONS = ("short", "memory", "idle", "time", "closed", "profiling", "done", "error")
OVERRUN_CAUSES = ("step", "start-up", "commit", "transfer", "yield", "preempted")
"""what held the device longest past a bubble's expected end (:mod:`pipefill_fill.overruns`)"""
"""Why a bubble went unused: too short for any step (``short``); no batch size fits its free memory (``memory``); no
work (``idle``); no step fits the time left (``time``); closed before the first step (``closed``); a profiling
step did not complete (``profiling``); the slice was already done (``done``); the workload raised (``error``)."""

# Overrun is bounded by the guard; buckets resolve the sub-millisecond range and the few-millisecond target.
_OVERRUN_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class FillMetrics:
    """Counters and gauges the runner updates; label values: ``fill_job`` (FillJob names), ``batch_size``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "pipefill_fill"
        self.bubbles_seen = Counter(f"{p}_bubbles_seen_total", "Bubbles announced by the trainer.", registry=registry)
        self.bubbles_used = Counter(
            f"{p}_bubbles_used_total", "Bubbles in which at least one step ran.", registry=registry
        )
        self.bubbles_skipped = Counter(
            f"{p}_bubbles_skipped_total",
            "Bubbles not used, by reason (short, memory, idle, time, closed, profiling, done, error).",
            ["reason"],
            registry=registry,
        )
        self.offered_seconds = Counter(
            f"{p}_offered_seconds_total", "Bubble time offered (expected end − open).", registry=registry
        )
        self.busy_seconds = Counter(
            f"{p}_busy_seconds_total", "Time spent running fill steps inside bubbles.", registry=registry
        )
        self.recovery_ratio = Gauge(
            f"{p}_bubble_recovery_ratio", "Busy seconds ÷ offered seconds since start.", registry=registry
        )
        self.overrun_seconds = Histogram(
            f"{p}_overrun_seconds",
            "How long past the bubble's expected end the fill kept the device, per used bubble.",
            buckets=_OVERRUN_BUCKETS,
            registry=registry,
        )
        self.overruns = Counter(
            f"{p}_overruns_total",
            "Used bubbles the fill overran past the guard, by cause (step, start-up, commit, transfer, yield).",
            ["cause"],
            registry=registry,
        )
        self.switch_seconds = Histogram(
            f"{p}_switch_seconds",
            "Wake-up and switch cost: bubble open → first step start.",
            buckets=_OVERRUN_BUCKETS,
            registry=registry,
        )
        self.items = Counter(
            f"{p}_items_total", "Units of work done (samples or steps), by job.", ["fill_job"], registry=registry
        )
        self.committed_items = Gauge(
            f"{p}_committed_items",
            "Units of work committed (durable), by job: over all its slices, so every executor of a split job reports "
            "the whole job (aggregate with max, not sum).",
            ["fill_job"],
            registry=registry,
        )
        self.commits = Counter(
            f"{p}_commits_total", "Commits (chunks or checkpoints), by job.", ["fill_job"], registry=registry
        )
        self.profile_step_seconds = Gauge(
            f"{p}_profile_step_seconds", "Profiled median step time.", ["fill_job", "batch_size"], registry=registry
        )
        self.profile_peak_bytes = Gauge(
            f"{p}_profile_peak_bytes", "Profiled peak memory of a step.", ["fill_job", "batch_size"], registry=registry
        )
        self.memory_budget_bytes = Gauge(
            f"{p}_memory_budget_bytes", "Device memory the fill may use.", registry=registry
        )
        self.memory_used_bytes = Gauge(
            f"{p}_memory_used_bytes",
            "Memory the fill's work holds now: on CUDA its allocator's reservation on the device, on CPU the growth "
            "of its resident set since the executor started (NaN until the device is known).",
            registry=registry,
        )
        self.memory_used_bytes.set(float("nan"))
        self.job_total_items = Gauge(
            f"{p}_job_total_items",
            "Units of work of the whole FillJob (spec.totalSamples, or steps), by job: with committed_items, its "
            "progress.",
            ["fill_job"],
            registry=registry,
        )
        self.job_failures = Counter(
            f"{p}_job_failures_total",
            "FillJobs this executor failed (the workload raised, or the job could not start or finish a slice).",
            ["fill_job"],
            registry=registry,
        )
        for reason in SKIP_REASONS:
            self.bubbles_skipped.labels(reason)
        for cause in OVERRUN_CAUSES:
            self.overruns.labels(cause)
        self._offered_s = 0.0
        self._busy_s = 0.0
        self._retired: dict[str, float] = {}  # job -> when the executor let go of it (monotonic s)
        self._batches: dict[str, set[str]] = {}  # job -> batch sizes of its profile series

    def bubble(self, *, offered_s: float, busy_s: float, overrun_s: float, used: bool) -> None:
        self.bubbles_seen.inc()
        self.offered_seconds.inc(max(0.0, offered_s))
        self._offered_s += max(0.0, offered_s)
        if used:
            self.bubbles_used.inc()
            self.busy_seconds.inc(busy_s)
            self._busy_s += busy_s
            self.overrun_seconds.observe(max(0.0, overrun_s))
        self.recovery_ratio.set(self._busy_s / self._offered_s if self._offered_s > 0 else 0.0)

    def watch_memory(self, in_use_bytes: Callable[[], int]) -> None:
        """Read the fill's memory at each scrape (:func:`pipefill_fill.device.memory_in_use`); NaN when it cannot
        be read (no ``/proc``)."""

        def read() -> float:
            try:
                return float(in_use_bytes())
            except OSError:
                return float("nan")

        self.memory_used_bytes.set_function(read)

    def retire(self, job: str, *, now_s: float | None = None) -> None:
        """The executor let go of ``job``: its series go after :data:`RETAIN_S` (unless it starts here again)."""
        self._retired[job] = time.monotonic() if now_s is None else now_s

    def prune(self, *, now_s: float | None = None) -> list[str]:
        """Remove the series of jobs retired more than :data:`RETAIN_S` ago; returns their names."""
        now = time.monotonic() if now_s is None else now_s
        gone = [job for job, at in self._retired.items() if now - at >= RETAIN_S]
        for job in gone:
            del self._retired[job]
            for metric in (self.job_total_items, self.committed_items, self.job_failures, self.items, self.commits):
                with contextlib.suppress(KeyError):  # a series this job never had (no failure, say)
                    metric.remove(job)
            for batch in self._batches.pop(job, set()):
                for metric in (self.profile_step_seconds, self.profile_peak_bytes):
                    with contextlib.suppress(KeyError):
                        metric.remove(job, batch)
        return gone

    def job_started(self, job: str, *, total: int, committed: int) -> None:
        """The executor took the job on: its size, where it stands, and its counters from 0 (a series that appears
        only at its first increment hides the increment from ``rate()``, and a short job may commit only at its end)."""
        self._retired.pop(job, None)
        self.job_total_items.labels(job).set(total)
        self.committed_items.labels(job).set(committed)
        for counter in (self.job_failures, self.items, self.commits):
            counter.labels(job)

    def profile(self, job: str, points: list[tuple[int, float, int]]) -> None:
        for batch_size, step_s, peak_bytes in points:
            self._batches.setdefault(job, set()).add(str(batch_size))
            self.profile_step_seconds.labels(job, str(batch_size)).set(step_s)
            self.profile_peak_bytes.labels(job, str(batch_size)).set(peak_bytes)
