"""Online estimates the runner decides with: the next step's duration, the commit's, the wake-up/switch cost, and
where a bubble really ends.

:class:`Estimator` keeps a window of recent measurements and predicts a high quantile of it. :class:`StepModel`
sizes a fill step of any batch size to the time left: a base time per batch size (the profile, corrected by the steps
run since) and, per bubble kind, the distribution of measured ÷ base of the recent steps (steps run slower in some
bubbles than in others). A step runs when its *expected overrun* — the mean, over that distribution, of how far it
would run past the time left — is within :data:`OVERRUN_BUDGET_S`. That is the rule a fixed quantile gets wrong at
both ends: for a large step even a rare slow run costs milliseconds, so it needs a wide margin; for the smallest steps
of a bubble's tail a slow run costs a fraction of a millisecond, so running one where it fits only most of the time
recovers the tail at almost no cost. :class:`EndModel` plans where a bubble ends.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable

__all__ = ["COLD_RATIO", "COLD_TRIES", "INTERRUPTED", "OVERRUN_BUDGET_S", "EndModel", "Estimator", "StepModel"]

OVERRUN_BUDGET_S = 5e-5
"""The expected overrun a step may have past the time left (the fill's deadline, itself a margin before the
trainer's expected end): 50 µs, a few percent of the smallest step."""

INTERRUPTED = 3.0
"""A step this many times slower than the base was interrupted (the process descheduled: another process took the
core): it says nothing about the step's own duration, so it stays out of the quantiles. A lasting slowdown still
moves the base (the anchors are medians of every step), after which such steps are no longer outliers."""


COLD_RATIO = 1.5
"""Before a step model has measured any step (a job's first steps, from its profile alone), a step fits only where
this many times its base does: with no distribution of measured ÷ base to size it by, "the base itself fits" ran
half of a new job's first steps past the deadline (issue #31: a queue's overruns came at each job's start). A model
that takes over another's distribution (:meth:`StepModel.adopt_ratios`) is not cold."""

COLD_TRIES = 16
"""A cold model that found no fitting step this many times sizes by the base alone: a job whose smallest step is
longer than its bubbles ÷ :data:`COLD_RATIO` would otherwise never run a step, and never learn."""


class Estimator:
    """A high quantile of the last ``window`` samples (seconds), or ``default_s`` before the first."""

    def __init__(self, *, default_s: float, window: int = 32, quantile: float = 0.9) -> None:
        self.default_s = default_s
        self.quantile = quantile
        self.samples: deque[float] = deque(maxlen=window)

    def record(self, value_s: float) -> None:
        self.samples.append(max(0.0, value_s))

    def predict_s(self) -> float:
        if not self.samples:
            return self.default_s
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]

    def __len__(self) -> int:
        return len(self.samples)


class EndModel:
    """When a bubble really ends: the trainer's expected end plus the ``quantile`` of how its last ``window``
    predictions at the same position (bubble kind and microbatch) turned out, actual close − expected end.

    The trainer predicts each wait as the median of its last few; at some positions it is right to a few µs, at
    others (short waits) it is off by milliseconds. A fixed guard before the expected end treats them alike. With
    this model the fill stops where, by that position's own record, the wait has ended only ``quantile`` of the
    time — but never later than the trainer expects: planning past it was tried and feeds on itself (a fill that
    runs past its trainer's resume delays the peer's data, the peer's waits grow, the peer's fill plans longer and
    runs past its own resume: in the co-location benchmark the step time grew by a quarter).
    """

    def __init__(self, *, quantile: float = 0.25, window: int = 16, warm: int = 4) -> None:
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"EndModel quantile {quantile!r} must be within 0..1")
        self.quantile, self.window, self.warm = quantile, window, warm
        self._errors: dict[tuple[str, int], _Window] = {}

    def record(self, key: tuple[str, int], close_ns: int, expected_end_ns: int) -> None:
        window = self._errors.get(key)
        if window is None:
            window = self._errors[key] = _Window(self.window)
        window.add(0, float(close_ns - expected_end_ns))

    def end_ns(self, key: tuple[str, int], expected_end_ns: int) -> int:
        """The bubble's end to plan for (the trainer's expected end until ``warm`` closes at the position were seen)."""
        window = self._errors.get(key)
        if window is None or len(window) < self.warm:
            return expected_end_ns
        return expected_end_ns + min(0, int(window.quantile(self.quantile)))


class StepModel:
    """Step time by batch size and bubble kind, from the profile (batch size → median seconds) and the steps run.

    ``base_s(b)``: per profiled batch size (an *anchor*), its profiled median times the median ratio measured ÷
    profiled of the recent steps nearest that size (the profile is taken inside bubbles, on a machine others may
    share: one slow anchor must not keep small steps from ever fitting), made non-decreasing in the batch size by
    pooling neighbours that invert the order, interpolated linearly between anchors and extrapolated along the last
    segment. The distribution of measured ÷ base: the last ``window`` steps in bubbles of that kind (of any kind
    until ``warm`` of that kind were seen), steps that were interrupted (:data:`INTERRUPTED`) left out;
    :meth:`largest_fitting` sizes a step by its expected overrun over that distribution, :meth:`predict_s` gives its
    ``quantile``. Samples older than ``horizon_s`` are forgotten: a burst of slow steps (another process on the core)
    would otherwise keep every step from fitting, and without steps no faster ratio would ever replace them.
    """

    def __init__(
        self,
        profiled_s: dict[int, float],
        *,
        window: int = 64,
        quantile: float = 0.99,
        warm: int = 4,
        horizon_s: float = 10.0,
        clock: Callable[[], int] = time.monotonic_ns,
        cold_ratio: float = COLD_RATIO,  # the margin of a model that has measured nothing yet (1: the base alone)
    ) -> None:
        if not profiled_s:
            raise ValueError("StepModel needs at least one profiled batch size")
        self.sizes = sorted(profiled_s)
        self.profiled = _monotone([profiled_s[b] for b in self.sizes])
        self.times = list(self.profiled)
        self.window, self.quantile, self.warm = window, quantile, warm
        self.horizon_ns, self.clock = int(horizon_s * 1e9), clock
        self._anchors = [_Window(window // 2) for _ in self.sizes]  # measured ÷ profiled, by nearest anchor
        self._recorded = 0
        self.interrupted = 0
        """steps that took more than ``INTERRUPTED`` × their prediction (left out of the quantiles)"""
        self._ratios: dict[str, _Window] = {}  # measured ÷ base, by bubble kind ("": any)
        self._factor: dict[str, float] = {}
        self._expires_ns = 0  # when the oldest sample kept ages out (0: none kept)
        self.cold_ratio = cold_ratio
        self.cold_refusals = 0  # sizings since the last step that found nothing fitting the cold margin

    def adopt_ratios(self, other: StepModel) -> None:
        """Take ``other``'s recent measured steps as this model's ratio distribution (each against this model's base):
        the early model of the same job, or the last job of the same workload on this device. A new model sizes its
        first steps by them rather than cold (:data:`COLD_RATIO`)."""
        now = self.clock()
        for key, theirs in other._ratios.items():
            window = self._ratios[key] = _Window(self.window)
            for t_ns, _, (batch_size, duration_s) in theirs._fifo:
                window.add(t_ns, duration_s / max(1e-9, self.base_s(batch_size)), (batch_size, duration_s))
            self._update(key, window, now)
        if other._expires_ns and (not self._expires_ns or other._expires_ns < self._expires_ns):
            self._expires_ns = other._expires_ns

    def base_s(self, batch_size: int) -> float:
        return _interpolate(self.sizes, self.times, batch_size)

    def factor(self, kind: str = "") -> float:
        """The learnt ratio measured ÷ base for bubbles of ``kind`` (of any kind before ``warm`` of it)."""
        if self._expires_ns and self.clock() > self._expires_ns:
            self._forget(self.clock())
        f = self._factor.get(kind)
        return self._factor.get("", 1.0) if f is None else f

    def predict_s(self, batch_size: int, kind: str = "") -> float:
        return self.base_s(batch_size) * self.factor(kind)

    def record(self, batch_size: int, duration_s: float, kind: str = "") -> None:
        now, duration_s = self.clock(), max(0.0, duration_s)
        self.cold_refusals = 0
        sizes = self.sizes
        k = min(bisect.bisect_left(sizes, batch_size), len(sizes) - 1)  # the nearest anchor, on a log scale
        if k and batch_size * batch_size < sizes[k - 1] * sizes[k]:
            k -= 1
        self._anchors[k].add(now, duration_s / max(1e-9, _interpolate(sizes, self.profiled, batch_size)))
        self._recorded += 1
        if self._recorded % 8 == 0 or self._recorded <= self.warm * len(sizes):
            self._reanchor(now)
        ratio = duration_s / max(1e-9, self.base_s(batch_size))
        if ratio > INTERRUPTED:
            self.interrupted += 1  # descheduled: no batch size predicts that; the anchors' medians saw it
            return
        for key in (kind, "") if kind else ("",):
            window = self._ratios.get(key)
            if window is None:
                window = self._ratios[key] = _Window(self.window)
            window.add(now, ratio, (batch_size, duration_s))
            self._update(key, window, now)
        if not self._expires_ns:
            self._expires_ns = now + self.horizon_ns + 1

    def _reanchor(self, now_ns: int) -> None:
        """Each anchor's time: its profiled median × the median ratio of its recent steps (the nearest anchor's that
        has some, else as profiled), then made non-decreasing."""
        medians: list[float | None] = []
        for window in self._anchors:
            window.drop_before(now_ns - self.horizon_ns)
            medians.append(window.quantile(0.5) if len(window) >= self.warm else None)
        known = [k for k, m in enumerate(medians) if m is not None]
        times = []
        for k, t in enumerate(self.profiled):
            near = min(known, key=lambda j: abs(j - k), default=None)
            times.append(t * (medians[near] or 1.0) if near is not None else t)
        old, self.times = self.times, _monotone(times)
        if any(abs(a - b) > 0.05 * b for a, b in zip(self.times, old, strict=True)):  # ratios to the old base: stale
            for key, window in self._ratios.items():
                window.revalue(lambda src: src[1] / max(1e-9, self.base_s(src[0])))
                self._update(key, window, now_ns)

    def _update(self, key: str, window: _Window, now_ns: int) -> None:
        window.drop_before(now_ns - self.horizon_ns)
        if len(window) >= self.warm:
            self._factor[key] = window.quantile(self.quantile)
        else:
            self._factor.pop(key, None)

    def _forget(self, now_ns: int) -> None:
        """Drop samples older than the horizon everywhere and recompute the anchors and factors from the rest."""
        self._reanchor(now_ns)
        oldest = None
        for key, window in self._ratios.items():
            self._update(key, window, now_ns)
            if len(window):
                oldest = window.oldest_ns if oldest is None else min(oldest, window.oldest_ns)
        for window in self._anchors:
            if len(window):
                oldest = window.oldest_ns if oldest is None else min(oldest, window.oldest_ns)
        self._expires_ns = 0 if oldest is None else oldest + self.horizon_ns + 1

    def largest_fitting(
        self,
        time_s: float,
        max_batch: int,
        kind: str = "",
        *,
        any_size: bool = True,
        budget_s: float = OVERRUN_BUDGET_S,
    ) -> int | None:
        """The largest batch size ≤ ``max_batch`` whose expected overrun past ``time_s`` is within ``budget_s``:
        any size (inference: every sample is computed alike whatever the batch), else only profiled sizes; None when
        not even the smallest qualifies."""
        ratios = self._ratios_of(kind)
        cold = self._cold(ratios)

        def fits(b: int) -> bool:
            return self._fits(self.base_s(b), time_s, ratios, budget_s, cold=cold)

        sizes = [b for b in self.sizes if b <= max_batch] or [min(self.sizes)]
        if not any_size:
            fitting = [b for b in sizes if fits(b)]
            self.cold_refusals += cold > 1.0 and not fitting
            return fitting[-1] if fitting else None
        lo, hi = 1, max(max_batch, 1)
        if not fits(lo):
            self.cold_refusals += cold > 1.0
            return None
        while lo < hi:  # the expected overrun grows with the batch: the largest that fits, by bisection
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def fits(self, base_s: float, time_s: float, kind: str = "", *, budget_s: float = OVERRUN_BUDGET_S) -> bool:
        """Whether work of ``base_s`` (a piece of a step: its share of the step's base) fits ``time_s`` by the same
        rule as a step (:meth:`largest_fitting`)."""
        ratios = self._ratios_of(kind)
        return self._fits(base_s, time_s, ratios, budget_s, cold=self._cold(ratios))

    def _cold(self, ratios: _Window | None) -> float:
        """The margin a step is sized with while no distribution is known (:data:`COLD_RATIO`, :data:`COLD_TRIES`)."""
        return self.cold_ratio if ratios is None and self.cold_refusals < COLD_TRIES else 1.0

    def _ratios_of(self, kind: str) -> _Window | None:
        if self._expires_ns and self.clock() > self._expires_ns:
            self._forget(self.clock())
        window = self._ratios.get(kind)
        if window is None or len(window) < self.warm:
            window = self._ratios.get("")
        return window if window is not None and len(window) >= self.warm else None

    @staticmethod
    def _fits(base: float, time_s: float, ratios: _Window | None, budget_s: float, *, cold: float = 1.0) -> bool:
        if ratios is None:  # nothing measured yet: the base with the cold margin must fit
            return base * cold <= time_s
        return base * ratios.mean_excess(time_s / max(base, 1e-12)) <= budget_s


def _monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence (pool adjacent violators: neighbours in the wrong order become their
    mean), so one noisy point is averaged with its neighbours rather than raising every larger size to it."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def _interpolate(sizes: list[int], times: list[float], batch_size: int) -> float:
    if len(sizes) == 1 or batch_size <= sizes[0]:
        return times[0] * (batch_size / sizes[0] if batch_size > sizes[0] else 1.0)
    i = min(bisect.bisect_left(sizes, batch_size), len(sizes) - 1)
    b0, b1, t0, t1 = sizes[i - 1], sizes[i], times[i - 1], times[i]
    return t0 + (t1 - t0) * (batch_size - b0) / (b1 - b0)


class _Window:
    """The last ``size`` samples (time, value, and what the value was computed from), also kept sorted by value: a
    quantile is one index, an update one insertion and at most a few removals (a step's bookkeeping stays a few
    microseconds); :meth:`revalue` recomputes every value when what they are relative to changed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._fifo: deque[tuple[int, float, tuple[int, float]]] = deque()
        self._sorted: list[float] = []
        self._suffix: list[float] | None = None

    def __len__(self) -> int:
        return len(self._fifo)

    @property
    def oldest_ns(self) -> int:
        return self._fifo[0][0]

    def add(self, t_ns: int, value: float, source: tuple[int, float] = (0, 0.0)) -> None:
        self._fifo.append((t_ns, value, source))
        bisect.insort(self._sorted, value)
        self._suffix = None
        if len(self._fifo) > self.size:
            self._pop()

    def drop_before(self, t_ns: int) -> None:
        while self._fifo and self._fifo[0][0] < t_ns:
            self._pop()

    def quantile(self, q: float) -> float:
        ordered = self._sorted
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def mean_excess(self, x: float) -> float:
        """Mean of max(0, value − x) over the window (one bisection; the suffix sums are rebuilt after a change)."""
        ordered = self._sorted
        if self._suffix is None:
            acc, suffix = 0.0, [0.0] * (len(ordered) + 1)
            for i in range(len(ordered) - 1, -1, -1):
                acc += ordered[i]
                suffix[i] = acc
            self._suffix = suffix
        i = bisect.bisect_right(ordered, x)
        return (self._suffix[i] - x * (len(ordered) - i)) / len(ordered) if ordered else 0.0

    def revalue(self, value_of: Callable[[tuple[int, float]], float]) -> None:
        self._fifo = deque((t, value_of(src), src) for t, _, src in self._fifo)
        self._sorted = sorted(v for _, v, _ in self._fifo)
        self._suffix = None

    def _pop(self) -> None:
        _, value, _ = self._fifo.popleft()
        del self._sorted[bisect.bisect_left(self._sorted, value)]
        self._suffix = None
