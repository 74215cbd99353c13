"""The no-fill baseline: the step time this rank measures in steps the fill executor did no work in.

The slowdown the fill causes is the step time with fill against the step time without it, measured in the same run
(same processes, caches, device state and machine load: :mod:`pipefill.bench.paired` shows that only such pairs
resolve a fraction of a percent). A step counts as fill-free, by ``source``:

- ``quiet``: one step in ``PIPEFILL_BASELINE_EVERY_STEPS`` (default 50; 0: never) announces no bubble (neither on time
  nor late), so the fill can start nothing in it; every rank picks the same step numbers, so no peer's fill runs
  either. It costs the fill that step's bubbles (2 % of its time by default). Counted only when the fill's answer
  block shows no work done during the step (a bubble of the step before may overrun into it).
- ``held``: the fill was held (``fill.hold`` in the channel directory, :func:`pipefill.channel.hold_fill`, as
  ``pipefill bench colocation`` does) when the step began and when it ended, and reported no work during it (the
  executor may take one more bubble after the hold appears). Hold every rank's fill together: a rank's step also
  waits on its peers.
- ``no-fill``: the job runs without fill (``spec.fill.enabled: false``: no bubble channel on any rank), so every
  step after the profile is one.

Never counted: the warm-up and profiling steps after a (re)start. No bubble is announced in them either, but they
are not like the steps that follow: on CUDA they drain the device after every action, and the fill executor starts
up beside them (on a CPU run that made them 20–30 % slower than the steps with fill); and steps the fill skipped
every bubble of (its wake-ups cost the trainer too, so they belong to "with fill").

The estimate is the median of the last :data:`WINDOW` fill-free steps: robust to the odd slow step, and current
after a long run. It is NaN until the first fill-free step.
"""

from __future__ import annotations

import os
import statistics
from collections import deque
from pathlib import Path
from typing import Protocol

from pipefill.channel import HOLD_FILE
from pipefill.channel.model import FillAnswer

__all__ = ["DEFAULT_EVERY_STEPS", "SOURCES", "WINDOW", "NoFillSteps"]

SOURCES = ("quiet", "held", "no-fill")
WINDOW = 64
"""Fill-free steps the median is taken over (the newest)."""
DEFAULT_EVERY_STEPS = 50
"""One step in this many is quiet (``PIPEFILL_BASELINE_EVERY_STEPS``): 2 % of the fill's bubbles for a baseline that
follows the job through its run."""


class _Producer(Protocol):
    def fill_answer(self) -> FillAnswer | None: ...


class _Sink(Protocol):
    def observe_baseline(self, *, source: str, baseline_s: float) -> None: ...


class NoFillSteps:
    """Picks the quiet steps, tells fill-free steps apart and keeps the baseline: ``begin`` before a step, ``end``
    after it (a stat and a read of the channel's answer block each, never inside a bubble)."""

    def __init__(self, sink: _Sink, *, producer: _Producer | None, channel_dir: Path | None, every_steps: int) -> None:
        self._sink, self._producer, self.every_steps = sink, producer, every_steps
        self._hold = str(channel_dir / HOLD_FILE) if channel_dir is not None else None
        self._steps_s: deque[float] = deque(maxlen=WINDOW)
        self._at_begin: tuple[bool, int | None] | None = (False, None)  # None: not read (the step cannot count)

    def quiet(self, step: int) -> bool:
        """Whether ``step`` (counted from the start of training, the same on every rank) announces no bubble."""
        return self._producer is not None and self.every_steps > 0 and (step + 1) % self.every_steps == 0

    def _held(self) -> bool:
        return self._hold is not None and os.path.exists(self._hold)

    def _state(self) -> tuple[bool, int | None]:
        """(fill held, the fill's used time since it attached: None when unreadable)."""
        if self._producer is None:
            return False, None
        held = self._held()
        answer = self._producer.fill_answer()
        return held, answer.used_total_ns if answer is not None else None

    def begin(self, *, quiet: bool | None = None) -> None:
        """Before a step; ``quiet``: whether it is one (None: not said). A step that is neither quiet nor begins held
        cannot count, so the fill's answer block is not read for it (two reads a step, ~0.1 ms together on a core
        the step's compute just left cold)."""
        cannot_count = self._producer is not None and quiet is False and not self._held()
        self._at_begin = None if cannot_count else self._state()

    def end(self, *, step_s: float, profiling: bool, quiet: bool) -> str | None:
        """Record the step just ended: ``profiling``, the warm-up or a profiling step; ``quiet``, one announcing
        nothing (:meth:`quiet`). Returns the source it counted under, or None."""
        if self._at_begin is None:  # began neither quiet nor held: it cannot count (see begin)
            return None
        held0, used0 = self._at_begin
        held1, used1 = self._state()
        idle = used0 is not None and used0 == used1  # the fill reported no work during the step
        source: str | None = None
        if profiling:
            source = None
        elif self._producer is None:
            source = "no-fill"
        elif quiet and idle:
            source = "quiet"
        elif held0 and held1 and idle:
            source = "held"
        if source is not None:
            self._steps_s.append(step_s)
            self._sink.observe_baseline(source=source, baseline_s=self.baseline_s)
        return source

    @property
    def baseline_s(self) -> float:
        """Median wall time of the recent fill-free steps; NaN before the first."""
        return statistics.median(self._steps_s) if self._steps_s else float("nan")
