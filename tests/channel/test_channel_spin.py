"""The fill's own model of the next bubble's open, the spin window around it, and a consumer that spins against a
real producer process: it still sees every bubble once, and catches some of them while spinning."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipefill.channel import Bubble, BubbleKind, Consumer
from pipefill.channel.nextopen import Anticipation, NextOpen

pytestmark = pytest.mark.alone  # times a quiet core (tests/sharing.py)

MS = 1_000_000


def test_gaps_are_learnt_per_position_and_errors_kept() -> None:
    model = NextOpen(min_samples=3)
    assert model.predict(("steady", 0), 100 * MS) == 0  # nothing seen yet
    for i, gap in enumerate((10, 12, 11)):
        model.observe(("steady", 0), 100 * i * MS, 100 * i * MS + gap * MS)
    model.observe(("end-of-step", 3), 0, 40 * MS)
    assert model.predict(("steady", 0), 500 * MS) == 511 * MS  # the median gap after that position
    assert model.predict(("end-of-step", 3), 0) == 0  # one sample is not enough
    model.observe(("steady", 0), 600 * MS, 613 * MS, predicted_ns=611 * MS)
    assert list(model.errors_ns) == [2 * MS]
    model.observe(("steady", 0), 700 * MS, 690 * MS)  # a negative gap (clock of another bubble): ignored
    assert model.predict(("steady", 0), 0) == 11.5 * MS  # median of 10, 12, 11, 13


def _bubble(i: int, open_ms: float, *, step: int = 0) -> Bubble:
    return Bubble(i, BubbleKind.STEADY, int(open_ms * MS), int((open_ms + 5) * MS), 1, step, 0, 1)


def test_the_window_is_centred_on_the_prediction_and_used_once() -> None:
    closes: dict[int, int] = {}
    a = Anticipation(lambda b: closes.get(b.id, 0))
    now_ms = time.monotonic_ns() / MS
    t = now_ms - 1000.0
    for i in range(1, 5):  # bubbles of 5 ms, 20 ms of compute between them
        b = _bubble(i, t, step=i)
        a.taken(b.id)
        assert a.predicted_open_ns(b) == (0 if i < 4 else int((t + 5) * MS) + 20 * MS)
        closes[i] = int((t + 5) * MS)
        t += 25.0
    assert a.window(b) is None  # spinning is off
    a.window_ns = 2 * MS
    assert a.window(b) is None  # the predicted open is long past: sleep until the bubble comes
    fresh = _bubble(5, now_ms - 4.0, step=5)  # just closed: the next one is due in 20 ms
    closes[5] = int((now_ms - 4.0 + 5) * MS)
    a.taken(5)
    assert a.prediction_ns == closes[4] + 20 * MS  # what was predicted for it (from bubble 4's close)
    start, end = a.window(fresh)  # type: ignore[misc]
    due = closes[5] + 20 * MS
    assert (start, end) == (due - MS, due + MS)
    a.spun(fresh, caught=False, spin_ns=2 * MS, over=True)
    assert a.window(fresh) is None and (a.spins, a.caught, a.spin_ns) == (1, 0, 2 * MS)


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a fill spins only on a core its trainer does not use")
def test_a_spinning_consumer_sees_every_bubble_and_catches_some_while_spinning(tmp_path: Path) -> None:
    channel = tmp_path / "channel"
    trainer_cpu = str(min(os.sched_getaffinity(0)))
    producer = subprocess.Popen(
        [sys.executable, "-m", "pipefill.bench.synthetic_trainer", "--channel-dir", str(channel), "--bubbles-ms", "5",
         "--compute-ms", "20", "--count", "40", "--cpu", trainer_cpu],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    seen: list[int] = []
    errors_ms: list[float] = []
    try:
        with Consumer.attach(channel_dir=channel, timeout_s=30) as c:
            os.sched_setaffinity(0, os.sched_getaffinity(0) - {int(trainer_cpu)})
            c.set_spin(0.008)
            while (b := c.wait_bubble(1.0)) is not None or c.trainer_alive():
                if b is None:
                    continue
                seen.append(b.id)
                if c.anticipation.prediction_ns:
                    errors_ms.append((b.open_ns - c.anticipation.prediction_ns) / MS)
                c.acknowledge(b.id, used_s=0.0)
            a = c.anticipation
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)) & os.sched_getaffinity(os.getppid()))
        producer.wait(timeout=30)
    assert producer.returncode == 0
    assert seen == sorted(set(seen)) and len(seen) >= 20  # in order, none twice (a busy machine may delay a wake-up
    # past a 5 ms bubble's close: then that bubble is not returned at all)
    assert errors_ms and sorted(abs(e) for e in errors_ms)[len(errors_ms) // 2] < 5.0  # the 20 ms gap was learnt
    assert 1 <= a.caught <= a.spins and a.spin_ns > 0
    with pytest.raises(ValueError, match="window must be ≥ 0"):
        c.set_spin(-1.0)
