"""Online estimates the runner decides with: the next step's duration, the commit's, the wake-up/switch cost.

Each keeps a window of recent measurements and predicts a high quantile of it (never less than the profiled median),
so one slow step moves the prediction up at once and the runner stops earlier, while one fast step cannot make it
start a step that would overrun.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Estimator", "StepPredictor"]


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


class StepPredictor:
    """Step-time estimators per batch size, seeded by the profile's medians."""

    def __init__(self, profiled_s: dict[int, float], *, window: int = 32, quantile: float = 0.9) -> None:
        self.profiled_s = dict(profiled_s)
        self._window, self._quantile = window, quantile
        self._by_batch: dict[int, Estimator] = {}

    def _est(self, batch_size: int) -> Estimator:
        if batch_size not in self._by_batch:
            base = self.profiled_s.get(batch_size)
            if base is None:  # scale the nearest smaller measured batch linearly: an upper bound for batched kernels
                smaller = [b for b in self.profiled_s if b < batch_size] or list(self.profiled_s)
                ref = max(smaller) if smaller else batch_size
                base = self.profiled_s.get(ref, 0.0) * batch_size / ref
            self._by_batch[batch_size] = Estimator(default_s=base, window=self._window, quantile=self._quantile)
        return self._by_batch[batch_size]

    def record(self, batch_size: int, duration_s: float) -> None:
        self._est(batch_size).record(duration_s)

    def predict_s(self, batch_size: int) -> float:
        est = self._est(batch_size)
        return max(est.predict_s(), self.profiled_s.get(batch_size, 0.0) if len(est) < 4 else 0.0)
