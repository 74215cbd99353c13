"""Online estimates the runner decides with: the next step's duration, the commit's, the wake-up/switch cost.

:class:`Estimator` keeps a window of recent measurements and predicts a high quantile of it. :class:`StepModel`
predicts a fill step of any batch size: the profile's medians, interpolated between the profiled batch sizes, times a
factor learnt from the steps run since — a high quantile of measured ÷ profiled, kept per bubble kind, because steps
run slower in some bubbles than in others (the end-of-step bubble, where the trainer's own threads may still run on
the shared core). One slow step moves the prediction up at once, so the runner stops earlier; one fast step cannot
make it start a step that would overrun. With the factor at a high quantile the last step of a bubble is the one sized
to the time left, so what the quantile costs is a fraction of one small step.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable

__all__ = ["INTERRUPTED", "EndModel", "Estimator", "StepModel"]

INTERRUPTED = 3.0
"""A step this many times slower than the base was interrupted (the process descheduled: another process took the
core): it says nothing about the step's own duration, so it stays out of the quantiles. A lasting slowdown still
moves the base (the anchors are medians of every step), after which such steps are no longer outliers."""


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
    segment. ``predict_s(b, kind)``: ``base_s(b)`` times the ``quantile`` of the last ``window`` ratios measured ÷
    base in bubbles of that kind (of any kind until ``warm`` of that kind were seen; 1.0 before any), steps that were
    interrupted (:data:`INTERRUPTED`) left out. Samples older
    than ``horizon_s`` are forgotten: a burst of slow steps (another process on the core) would otherwise keep every
    step from fitting, and without steps no faster ratio would ever replace them.
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

    def largest_fitting(self, time_s: float, max_batch: int, kind: str = "", *, any_size: bool = True) -> int | None:
        """The largest batch size ≤ ``max_batch`` whose predicted step fits ``time_s``: any size (inference: every
        sample is computed alike whatever the batch), else only profiled sizes; None when not even the smallest fits."""
        budget = time_s / self.factor(kind)
        sizes, times = self.sizes, self.times
        if budget < times[0]:
            return None
        if not any_size:
            fit = [b for b, t in zip(sizes, times, strict=True) if t <= budget and b <= max_batch]
            return fit[-1] if fit else None
        best = sizes[0]
        for i in range(1, len(sizes)):
            b0, b1, t0, t1 = sizes[i - 1], sizes[i], times[i - 1], times[i]
            if t1 <= budget:
                best = b1
                continue
            if t1 > t0:
                best = max(best, b0 + int((budget - t0) * (b1 - b0) / (t1 - t0)))
            break
        else:  # past the largest profiled size: extrapolate along the last segment
            if len(sizes) > 1 and times[-1] > times[-2]:
                slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
                best = max(best, sizes[-1] + int((budget - times[-1]) / slope))
        if len(sizes) == 1 and budget >= times[0]:
            best = sizes[0]
        return min(best, max_batch) if best >= 1 else None


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

    def __len__(self) -> int:
        return len(self._fifo)

    @property
    def oldest_ns(self) -> int:
        return self._fifo[0][0]

    def add(self, t_ns: int, value: float, source: tuple[int, float] = (0, 0.0)) -> None:
        self._fifo.append((t_ns, value, source))
        bisect.insort(self._sorted, value)
        if len(self._fifo) > self.size:
            self._pop()

    def drop_before(self, t_ns: int) -> None:
        while self._fifo and self._fifo[0][0] < t_ns:
            self._pop()

    def quantile(self, q: float) -> float:
        ordered = self._sorted
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def revalue(self, value_of: Callable[[tuple[int, float]], float]) -> None:
        self._fifo = deque((t, value_of(src), src) for t, _, src in self._fifo)
        self._sorted = sorted(v for _, v, _ in self._fifo)

    def _pop(self) -> None:
        _, value, _ = self._fifo.popleft()
        del self._sorted[bisect.bisect_left(self._sorted, value)]
