"""One rank's figures, fed one event-log record at a time: the report feeds whole logs, the live view each tick's new
records, the co-location benchmark the records of its measured steps — so all three agree.

Bubble fraction is the trainer's measured idle time ÷ its step time, over the steps whose waits were logged.
**Recovery** is the fill's step time inside the trainer's waits ÷ those waits' whole length
(:class:`pipefill.local.idle.IdleAccount`): announcing less, or holding a bubble without working, cannot raise it.
Beside it, ``announced_recovery`` divides the same step time by the announced waits only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from pipefill.events import BubbleEvent, CommitEvent, Event, FillEvent, StepEvent
from pipefill.local.idle import WORK, IdleAccount, breakdown_rows

__all__ = ["RankStats", "merged", "overrun_summary", "quantile", "worst_overruns"]


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; 0 for none)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def overrun_summary(bubbles: Iterable[FillEvent]) -> dict[str, Any]:
    """Overruns of the bubbles ``bubbles`` worked in (``steps`` > 0): p50, p99 and max in ms, how many were past the
    guard and their causes (the executor records a cause past the guard only); and the trainer's waits for the fill
    after closing a bubble (``trainer_wait_s``): p99, max, and how many over 1 ms."""
    worked = [b for b in bubbles if b.steps]
    ms = [1e3 * b.overrun_s for b in worked]
    waits = [1e3 * b.trainer_wait_s for b in worked]
    causes: dict[str, int] = defaultdict(int)
    for b in worked:
        if b.overrun_cause:
            causes[b.overrun_cause] += 1
    return {
        "bubbles": len(worked),
        "overrun_p50_ms": round(quantile(ms, 0.5), 3),
        "overrun_p99_ms": round(quantile(ms, 0.99), 3),
        "overrun_max_ms": round(max(ms, default=0.0), 3),
        "past_guard": sum(causes.values()),
        "causes": dict(sorted(causes.items(), key=lambda kv: -kv[1])),
        "trainer_wait_p99_ms": round(quantile(waits, 0.99), 3),
        "trainer_wait_max_ms": round(max(waits, default=0.0), 3),
        "trainer_waits_over_1ms": sum(w > 1.0 for w in waits),
    }


def worst_overruns(
    bubbles: Iterable[FillEvent],
    commits: Iterable[CommitEvent],
    n: int = 8,
    *,
    stolen: Callable[[FillEvent], float] | None = None,
) -> list[dict[str, Any]]:
    """The ``n`` bubbles that overran most, each with what a cause needs: the last step (its kind, batch size and
    length), the time the planner had left for it when it started (``slack_ms``: deadline − its start; a step longer
    than that is what overran), the margin, how far into the run it fell, and whether a commit's file part was being
    written on the writer thread meanwhile (``writing``: it shares the process, and so the GIL, with the steps), and where
    the last step's time went (``last_host_ms``, ``last_cpu_ms``, ``last_switches``: :func:`_trace`); with ``stolen``,
    the VM's steal on the fill's core during the bubble (``stolen_ms``: :mod:`pipefill.bench.steal`)."""
    worked = sorted((b for b in bubbles if b.steps and b.spans_ns), key=lambda b: -b.overrun_s)[:n]
    first = min((b.open_ns for b in worked), default=0)
    writes = [(c.mono_ns - int(c.write_s * 1e9), c.mono_ns) for c in commits if c.write_s > 0]
    rows = []
    for b in worked:
        start, end = b.spans_ns[-1]
        kinds, sizes = b.span_kinds, b.batch_sizes
        rows.append(
            {
                "overrun_ms": round(b.overrun_s * 1e3, 3),
                "cause": b.overrun_cause,
                "stop": b.stop,
                "job": b.job,
                "at_s": round((b.open_ns - first) / 1e9, 3),
                "steps": b.steps,
                "last_kind": kinds[-1] if len(kinds) == len(b.spans_ns) else None,
                "last_batch": sizes[-1] if len(sizes) == len(b.spans_ns) else None,
                "last_ms": round((end - start) / 1e6, 3),
                "slack_ms": round((b.deadline_ns - start) / 1e6, 3) if b.deadline_ns is not None else None,
                "margin_ms": round(b.margin_s * 1e3, 3),
                "commits": len(b.commits_ns),
                "writing": any(w0 < end and start < w1 for w0, w1 in writes),
                **_trace(b),
                **({"stolen_ms": round(stolen(b), 1)} if stolen is not None else {}),
            }
        )
    return rows


def _trace(b: FillEvent) -> dict[str, Any]:
    """Where the last step's time went (the executor's ``step_trace``): its host part, the filling thread's CPU, its
    voluntary and involuntary context switches and (logs since session 34) its page faults; nothing for a record
    without it."""
    if len(b.step_trace) != len(b.spans_ns):
        return {}
    host_us, cpu_us, voluntary, involuntary, *faults = b.step_trace[-1]
    row = {"last_host_ms": host_us / 1e3, "last_cpu_ms": cpu_us / 1e3, "last_switches": [voluntary, involuntary]}
    return {**row, "last_faults": faults[0]} if faults else row


def merged(*logs: Iterable[Event]) -> list[Event]:
    """The records of several logs in the order they were written (``mono_ns``): the order a live tail sees."""
    return sorted((e for log in logs for e in log), key=lambda e: e.mono_ns)


class RankStats:
    """One rank's row of ``report.json``; :meth:`add` takes any record of the rank's trainer or fill executor."""

    def __init__(self) -> None:
        self.last_step: StepEvent | None = None  # the newest step
        self.idle = IdleAccount()
        self._measured_steps: set[int] = set()
        self._step_s: float = 0  # over steps with measured bubbles
        self._unmeasured_s: dict[int, list[float]] = defaultdict(list)  # steps whose bubbles are not seen (yet)
        self._by_kind: dict[str, dict[str, float]] = defaultdict(
            lambda: {"count": 0, "total_s": 0.0, "announced_s": 0.0}
        )
        self._busy_ns = 0
        self._bubbles_used = 0
        self._overrun_max_s: float | None = None

    def add(self, e: Event) -> None:
        """Take in one record of the rank's trainer or fill executor (other records are ignored)."""
        self.idle.add(e)
        if isinstance(e, StepEvent):
            self.last_step = e
            if e.step in self._measured_steps:
                self._step_s += e.step_s
            else:
                self._unmeasured_s[e.step].append(e.step_s)
        elif isinstance(e, BubbleEvent):
            if e.step not in self._measured_steps:
                self._measured_steps.add(e.step)
                for step_s in self._unmeasured_s.pop(e.step, []):
                    self._step_s += step_s
            d = (e.end_ns - e.start_ns) / 1e9
            row = self._by_kind[e.kind]
            row["count"] += 1
            row["total_s"] += d
            row["announced_s"] += d if e.announced else 0.0
        elif isinstance(e, FillEvent) and e.steps:
            self._busy_ns += e.yielded_ns - e.woke_ns
            self._bubbles_used += 1
            overrun_s = e.overrun_s
            self._overrun_max_s = overrun_s if self._overrun_max_s is None else max(self._overrun_max_s, overrun_s)

    def finish(self) -> None:
        """The logs are complete: account the waits still waiting for their fill record."""
        self.idle.flush()

    def summary(self) -> dict[str, Any]:
        """The rank's row of ``report.json``."""
        bubble_s = sum(r["total_s"] for r in self._by_kind.values())
        announced_s = sum(r["announced_s"] for r in self._by_kind.values())
        idle = self.idle
        idle_s, steps_s = idle.idle_s(), sum(idle.piece_s(k) for k in WORK)
        offered_s = idle_s - idle.piece_s("not_announced")
        return {
            "steps_measured": len(self._measured_steps),
            "bubble_fraction": bubble_s / self._step_s if self._step_s else None,
            "bubble_s": bubble_s,
            "announced_bubble_s": announced_s,
            "by_kind": dict(self._by_kind),
            "fill_busy_s": self._busy_ns / 1e9,
            "fill_step_s": steps_s,
            "bubble_recovery": steps_s / idle_s if idle_s else None,
            "announced_recovery": steps_s / offered_s if offered_s else None,
            "idle_breakdown": breakdown_rows(idle),
            "fill_overrun_past_close_s": idle.overrun_past_close_s,
            "fill_bubbles_used": self._bubbles_used,
            "fill_overrun_max_s": 0.0 if self._overrun_max_s is None else self._overrun_max_s,
        }
