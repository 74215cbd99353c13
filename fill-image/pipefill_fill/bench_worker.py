"""``python -m pipefill_fill.bench_worker``: naive co-location — the fill workload run back to back, bubbles ignored.

The fill image's one benchmark worker; only benchmarks start it, the executor's runtime never imports it. The stand-in
for GPU time-slicing without coordination in ``pipefill bench colocation`` (mode C, :mod:`pipefill.bench.colocation`):
the same FillJob runs at the same OS priority on the trainer's core (or GPU) the whole time, as two uncoordinated
processes sharing a device would. Only the runner differs from the fill executor's: start-up is the executor's own
(:func:`pipefill_fill.__main__.main`: the environment contract, CPU pinning, channel attach, device selection, memory
cap, work source, metrics, event log), so both sides of the comparison share every setting. :class:`NaiveRunner` takes
the first job it can acquire, profiles it (or loads the profile cache), and runs ``step`` at the batch size of the
highest profiled throughput without ever waiting for a bubble. Commits go through :class:`FillTask`'s commit policy
and store, so progress is exactly once as the executor's is. The channel is read only to notice that the trainer is
gone (then, or on SIGTERM, it commits and exits 0).

Event log: the executor's ``start``, ``job``, ``profile`` (plus ``batch_size``: the one it runs), ``commit`` and
``exit`` events, and ``work`` about every 0.1 s: ``job``, ``start_ns``, ``end_ns`` (CLOCK_MONOTONIC), ``steps`` and
``items`` done in that span.
"""

from __future__ import annotations

import logging
import signal
import sys
import time

from pipefill.events import CommitEvent, JobEvent, ProfileEvent, WorkEvent
from pipefill.plan import ProfilePoint
from pipefill.spec import FillJobPhase
from pipefill_fill.device import device_sync
from pipefill_fill.profiler import profile_task
from pipefill_fill.runner import Attached, Stoppable
from pipefill_fill.sources import ProgressReport
from pipefill_fill.sources.base import now_rfc3339
from pipefill_fill.task import FillTask, TaskSpec

__all__ = ["NaiveRunner", "best_batch_size", "main"]

log = logging.getLogger("pipefill_fill")


def best_batch_size(points: tuple[ProfilePoint, ...] | list[ProfilePoint], budget_bytes: int) -> int | None:
    """The profiled batch size with the most units of work per second within ``budget_bytes``; None: none fits."""
    fits = [p for p in points if p.peak_bytes <= budget_bytes]
    return max(fits, key=lambda p: p.items / p.step_s).batch_size if fits else None


class NaiveRunner(Stoppable):
    """Built like :class:`pipefill_fill.runner.Runner`, from what the executor attached; ``run`` returns the exit code."""

    def __init__(self, attached: Attached, *, work_interval_s: float = 0.1, trainer_grace_s: float = 1.0) -> None:
        self.link, self.source, self.device = attached.link, attached.source, attached.device
        self.settings, self.metrics, self.events = attached.settings, attached.metrics, attached.events
        self.work_interval_ns = int(work_interval_s * 1e9)
        self.trainer_grace_s = trainer_grace_s  # as the executor: a restarted trainer re-creates the channel
        self.failed: set[str] = set()
        self._dead_since: float | None = None
        self._reported_at = 0.0
        self._stop = ""

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._request_stop("SIGTERM"))
        log.info("naive co-location: running fill work back to back, ignoring bubbles")
        while not self._stop:
            spec = self._next_job()
            if spec is not None:
                self._run_job(spec)
            elif not self._trainer_gone():
                time.sleep(0.5)
        return self._exit()

    def _trainer_gone(self) -> bool:
        if self.link.trainer_alive():
            self._dead_since = None
        elif self._dead_since is None:
            self._dead_since = time.monotonic()
        elif time.monotonic() - self._dead_since >= self.trainer_grace_s:
            self._request_stop("trainer gone")
        return bool(self._stop)

    def _next_job(self) -> TaskSpec | None:
        for spec in self.source.poll():
            if spec.name not in self.failed and self.source.acquire(spec.name):
                return spec
        return None

    def _run_job(self, spec: TaskSpec) -> None:
        name, budget, started = spec.name, self.settings.reserved_bytes, now_rfc3339()
        task: FillTask | None = None
        try:
            task = FillTask(spec)
            recovered = task.open(device=self.device, memory_budget_bytes=budget)
            if recovered.done:
                self.source.report(name, ProgressReport(FillJobPhase.SUCCEEDED, recovered.end, spec.total))
                return
            profile = profile_task(task, self.device, memory_budget_bytes=budget)
            batch = best_batch_size(profile.points, budget)
            points = [
                {"batch_size": p.batch_size, "step_s": p.step_s, "peak_bytes": p.peak_bytes} for p in profile.points
            ]
            self.events.write(
                ProfileEvent(
                    job=name, cached=profile.cached, device=profile.device_key, points=points, batch_size=batch
                )
            )
            if batch is None:
                raise ValueError(f"no profiled batch size fits the memory budget of {budget} bytes")
            self.events.write(JobEvent(job=name, phase="Running", committed=recovered.end, total=spec.total))
            self.source.report(
                name, ProgressReport(FillJobPhase.RUNNING, recovered.end, spec.total, start_time=started)
            )
            log.info("job %s: running batch %d back to back from %d/%d", name, batch, recovered.end, spec.total)
            self._work(task, batch, started)
        except Exception as exc:  # a raising workload fails its job alone, as in the executor
            self._fail(spec, f"{type(exc).__name__}: {exc}", committed=task.committed if task is not None else 0)
        finally:
            self.source.release(name)

    def _work(self, task: FillTask, batch: int, started: str) -> None:
        name, total = task.spec.name, task.spec.total
        span_ns, steps, items = time.monotonic_ns(), 0, 0
        while not self._stop and not task.done():
            items += task.step(batch)
            steps += 1
            device_sync(self.device)  # a step ends when the device is free, as in the executor
            if task.commit_due():
                self._commit(task, started)
            now = time.monotonic_ns()
            if now - span_ns >= self.work_interval_ns:
                self._record_work(name, span_ns, now, steps, items)
                span_ns, steps, items = now, 0, 0
                self._trainer_gone()
        if steps:
            self._record_work(name, span_ns, time.monotonic_ns(), steps, items)
        if task.done():
            task.finish()
            self.events.write(JobEvent(job=name, phase="Succeeded", committed=task.committed, total=total))
            report = ProgressReport(
                FillJobPhase.SUCCEEDED, task.committed, total, start_time=started, completion_time=now_rfc3339()
            )
            self.source.report(name, report)
            log.info("job %s: succeeded (%d/%d)", name, task.committed, total)
            return
        written = task.commit()  # stopping: make what is done durable, so a restart continues from there
        self.events.write(CommitEvent(job=name, end=task.committed, bytes=written, commit_s=0.0, at="shutdown"))
        self.source.report(name, ProgressReport(FillJobPhase.RUNNING, task.committed, total, start_time=started))

    def _record_work(self, name: str, start_ns: int, end_ns: int, steps: int, items: int) -> None:
        self.events.write(WorkEvent(job=name, start_ns=start_ns, end_ns=end_ns, steps=steps, items=items))
        self.metrics.items.labels(name).inc(items)

    def _commit(self, task: FillTask, started: str) -> None:
        name = task.spec.name
        t0 = time.monotonic_ns()
        written = task.commit()
        commit_s = (time.monotonic_ns() - t0) / 1e9
        self.metrics.commits.labels(name).inc()
        self.metrics.committed_items.labels(name).set(task.committed)
        self.events.write(CommitEvent(job=name, end=task.committed, bytes=written, commit_s=commit_s))
        if time.monotonic() - self._reported_at >= 2.0:
            self._reported_at = time.monotonic()
            report = ProgressReport(FillJobPhase.RUNNING, task.committed, task.spec.total, start_time=started)
            self.source.report(name, report)

    def _fail(self, spec: TaskSpec, message: str, *, committed: int) -> None:
        log.error("job %s: failed: %s", spec.name, message)
        self.failed.add(spec.name)
        self.events.write(JobEvent(job=spec.name, phase="Failed", message=message))
        self.source.report(spec.name, ProgressReport(FillJobPhase.FAILED, committed, spec.total, message=message))


def main() -> int:
    """The fill executor's ``main`` with :class:`NaiveRunner` in place of its runner."""
    from pipefill_fill.__main__ import main as executor_main

    return executor_main(runner_cls=NaiveRunner)


if __name__ == "__main__":
    sys.exit(main())
