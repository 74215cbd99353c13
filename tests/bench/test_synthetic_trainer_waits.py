"""The synthetic trainer's exclusive-device mode (``--wait-fill``, ``pipefill bench fill --trainer waits``): back from
a bubble, it computes only once the fill has yielded it — through the real channel, a real consumer in this process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipefill.channel import Consumer

MS = 1_000_000
HOLD_MS = 15  # how long past a bubble's close the consumer keeps working on every other bubble


def _run(tmp_path: Path, *flags: str) -> tuple[list[dict[str, int]], dict[int, int]]:
    """Eight 5 ms bubbles; the consumer holds the even ones ``HOLD_MS`` past their close and yields the odd ones at
    once. The trainer's log, and when each held bubble's yield began (CLOCK_MONOTONIC ns)."""
    log = tmp_path / "bubbles.jsonl"
    producer = subprocess.Popen(
        [sys.executable, "-m", "pipefill.bench.synthetic_trainer", "--channel-dir", str(tmp_path / "channel"),
         "--bubbles-ms", "5", "--compute-ms", "2", "--count", "8", "--log", str(log), *flags],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    yielding: dict[int, int] = {}
    try:
        with Consumer.attach(channel_dir=tmp_path / "channel", timeout_s=30) as c:
            while (b := c.wait_bubble(1.0)) is not None or c.trainer_alive():
                if b is None:
                    continue
                if b.id % 2 == 0:
                    while c.is_open(b.id):  # the fill's step goes on past the bubble's end ...
                        time.sleep(1e-4)
                    time.sleep(HOLD_MS / 1e3)
                    yielding[b.id] = time.monotonic_ns()  # ... and yields this long after it
                c.acknowledge(b.id, used_s=0.0)
    finally:
        producer.wait(timeout=30)
    assert producer.returncode == 0
    return [json.loads(line) for line in log.read_text().splitlines()], yielding


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_waiting_trainer_computes_only_once_the_fill_has_yielded(tmp_path: Path) -> None:
    rows, yielding = _run(tmp_path, "--wait-fill")
    assert len(rows) == 8 and len(yielding) >= 2  # a busy machine may let a bubble close before the fill wakes
    by_id = {r["id"]: r for r in rows}
    for bid, t in yielding.items():
        r = by_id[bid]
        assert r["resume_ns"] >= t, f"bubble {bid} resumed {(t - r['resume_ns']) / MS:.2f} ms before the fill yielded"
        assert r["resume_ns"] - r["close_ns"] >= HOLD_MS * MS
    quick = [r["resume_ns"] - r["close_ns"] for r in rows if r["id"] not in yielding]
    assert quick and min(quick) < 5 * MS  # a fill that yielded in time (or never took the bubble) is not waited for


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_sharing_trainer_computes_at_once_beside_the_fill(tmp_path: Path) -> None:
    rows, yielding = _run(tmp_path)
    assert len(rows) == 8 and yielding
    assert all(r["resume_ns"] == r["close_ns"] for r in rows)
    assert any(by["resume_ns"] < yielding[by["id"]] for by in rows if by["id"] in yielding)
