"""When the next bubble will open: the fill's own model of the trainer's timeline (no channel field needed).

A pipeline step repeats the same waits in the same order, and the compute between two waits — the *gap* from a
bubble's close to the next bubble's open — repeats with them. The model keeps, per position (the kind and microbatch
of the bubble before the gap: a rank waits once per microbatch and kind, except a middle stage's steady waits before
a forward and a backward of the same microbatch, which then share a key), the median of the last gaps it saw, and
predicts the next open as the last bubble's close (its expected end while it is still open) plus that gap. Not the
bubble's ordinal in its step: which short waits are announced varies from step to step, and shifts every ordinal. The consumer uses it to spin shortly before a
predicted bubble instead of sleeping through the wake-up (docs/channel.md, "Spinning before a predicted bubble").
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

from pipefill.channel.model import Bubble

__all__ = ["Anticipation", "NextOpen"]


class NextOpen:
    """Gaps by position, and the errors of its own predictions (actual open − predicted open, ns)."""

    def __init__(self, *, window: int = 9, min_samples: int = 3, errors: int = 512) -> None:
        self.window, self.min_samples = window, min_samples
        self._gaps: dict[tuple[str, int], deque[int]] = {}
        self._medians: dict[tuple[str, int], int] = {}
        self.errors_ns: deque[int] = deque(maxlen=errors)

    def observe(self, key: tuple[str, int], close_ns: int, next_open_ns: int, predicted_ns: int = 0) -> None:
        """The bubble at position ``key`` closed at ``close_ns`` and the next one opened at ``next_open_ns``
        (``predicted_ns``: what :meth:`predict` said before it opened; 0: no prediction)."""
        gap = next_open_ns - close_ns
        if gap < 0:
            return
        window = self._gaps.setdefault(key, deque(maxlen=self.window))
        window.append(gap)
        if len(window) >= self.min_samples:
            self._medians[key] = int(statistics.median(window))
        if predicted_ns:
            self.errors_ns.append(next_open_ns - predicted_ns)

    def predict(self, key: tuple[str, int], close_ns: int) -> int:
        """CLOCK_MONOTONIC ns at which the bubble after the one at ``key`` (closed, or expected to close, at
        ``close_ns``) should open; 0 when too few gaps after that position were seen."""
        gap = self._medians.get(key)
        return 0 if gap is None else close_ns + gap


class Anticipation:
    """A consumer's prediction of its next bubble and its spin window around it, with the spin's counters.

    ``close_of(bubble)`` gives the CLOCK_MONOTONIC ns a returned bubble closed at (0 while open): the prediction
    starts from the bubble's expected end and moves to its close once that is known.
    """

    def __init__(self, close_of: Callable[[Bubble], int]) -> None:
        self.model = NextOpen()
        self.close_of = close_of
        self.window_ns = 0
        """spin window length (0: no spinning)"""
        self.prediction_ns = 0
        """the predicted open of the bubble returned last (0: none was predicted)"""
        self.spins = 0
        """windows spun in"""
        self.caught = 0
        """bubbles that opened while the consumer spun"""
        self.spin_ns = 0
        """time spent spinning, ns (CPU time: the loop never sleeps)"""
        self._prev: Bubble | None = None  # the bubble the current prediction is made from
        self._pred_ns = 0
        self._pred_closed = False
        self._spun_for = -1

    def taken(self, bubble_id: int) -> None:
        """A bubble was returned: remember what had been predicted for it (the hot path: two attribute reads)."""
        prev = self._prev
        self.prediction_ns = self._pred_ns if prev is not None and prev.id == bubble_id - 1 else 0

    def predicted_open_ns(self, cur: Bubble | None) -> int:
        """When the bubble after ``cur`` (the one returned last) should open; 0: unknown yet."""
        if cur is None:
            return 0
        prev = self._prev
        if prev is None or prev.id != cur.id:  # a new bubble since the last prediction: learn the gap before it
            if prev is not None and cur.id == prev.id + 1:
                close = self.close_of(prev)
                if close:
                    self.model.observe((str(prev.kind), prev.mb_idx), close, cur.open_ns, self._pred_ns)
            self._prev, self._pred_ns, self._pred_closed = cur, 0, False
        if not self._pred_closed:
            close = self.close_of(cur)
            self._pred_closed = bool(close)
            self._pred_ns = self.model.predict((str(cur.kind), cur.mb_idx), close or cur.expected_end_ns)
        return self._pred_ns

    def window(self, cur: Bubble | None) -> tuple[int, int] | None:
        """[start, end) ns of the spin around the next predicted open; None: no spinning now (off, no prediction,
        spun already for this bubble, or the window passed while the fill worked)."""
        if not self.window_ns or cur is None or self._spun_for == cur.id:
            return None
        pred = self.predicted_open_ns(cur)
        if not pred:
            return None
        half = self.window_ns // 2
        if time.monotonic_ns() >= pred + half:
            self._spun_for = cur.id
            return None
        return pred - half, pred + half

    def spun(self, cur: Bubble | None, *, caught: bool, spin_ns: int, over: bool) -> None:
        """Account one spin; ``over``: the window ended (or a bubble came), so no second spin for ``cur``."""
        self.spin_ns += spin_ns
        if caught or over:
            self.spins += 1
            self.caught += caught
            if cur is not None and not caught:
                self._spun_for = cur.id
