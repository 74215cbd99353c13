"""The channel between real processes over real shared memory: tracking, torn reads, kills, restarts."""

from __future__ import annotations

import itertools
import json
import random
import signal
import time
from pathlib import Path

import pytest
from channel_peer import expected

from pipefill.channel import Bubble, Consumer, Producer
from pipefill.channel._mapping import Mapping
from pipefill.channel.layout import BUBBLE_CLOSED, BUBBLE_OPEN

pytestmark = pytest.mark.slow


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_lockstep_consumer_sees_every_bubble_once_and_never_works_after_close(channel_dir, peers, tmp_path) -> None:
    """2000 bubbles, each held until the fill has seen it: every id exactly once, in order, none torn, and no
    chunk of work started after the producer's close_bubble returned."""
    n = 2000
    c = peers("consumer", channel_dir, "--exit-on-dead", "--chunk-us", "20", "--out", str(tmp_path / "c.json"))
    p = peers("producer", channel_dir, "--count", str(n), "--lockstep", "--hold-us", "300", "--seed", "1",
              "--out", str(tmp_path / "p.json"))  # fmt: skip
    assert p.finish(timeout_s=90) == 0
    assert c.finish(timeout_s=10) == 0
    prod, cons = _read(tmp_path / "p.json"), _read(tmp_path / "c.json")
    assert prod["missed"] == []
    assert cons["seen"] == list(range(1, n + 1))
    assert cons["torn"] == []
    closed_after = {int(k): v for k, v in prod["closed_after"].items()}
    late = {int(i): t for i, t in cons["last_chunk"].items() if t >= closed_after[int(i)]}
    assert late == {}, f"work started after close_bubble returned: {list(late)[:10]}"
    assert cons["history"] == prod["history"] == 64


def test_free_running_producer_never_waits_and_consumer_sees_no_duplicate_or_torn_bubble(
    channel_dir, peers, tmp_path
) -> None:
    """The producer opens and closes 5000 bubbles as fast as it can (holds of 0-50 µs); the consumer catches what
    it can: strictly increasing ids, every one whole, none worked on after its close."""
    n = 5000
    c = peers("consumer", channel_dir, "--exit-on-dead", "--chunk-us", "5", "--out", str(tmp_path / "c.json"))
    p = peers("producer", channel_dir, "--count", str(n), "--hold-us", "50", "--gap-us", "20", "--seed", "2",
              "--out", str(tmp_path / "p.json"))  # fmt: skip
    assert p.finish(timeout_s=60) == 0
    assert c.finish(timeout_s=10) == 0
    prod, cons = _read(tmp_path / "p.json"), _read(tmp_path / "c.json")
    seen = cons["seen"]
    assert seen, "the consumer saw no bubble at all"
    assert all(a < b for a, b in itertools.pairwise(seen)), "ids not strictly increasing (duplicate?)"
    assert seen[-1] <= n
    assert cons["torn"] == []
    closed_after = {int(k): v for k, v in prod["closed_after"].items()}
    assert all(t < closed_after[int(i)] for i, t in cons["last_chunk"].items())


@pytest.mark.alone  # times a quiet core (tests/sharing.py)
def test_seqlock_reader_never_sees_a_torn_descriptor(channel_dir, peers) -> None:
    """Hammer the raw seqlock readers (bubble block and ring) in this process while a producer process rewrites
    them as fast as it can: every snapshot must be exactly one bubble's fields."""
    p = peers("producer", channel_dir)
    p.expect("ready")
    m = Mapping.open_existing(channel_dir / "channel")
    try:
        snapshots = rings = 0
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            snap = m.read_bubble()
            if snap is None:
                continue
            bid, state, kind, open_ns, end_ns, free_bytes, step, mb_idx, _, close_ns = snap[1]
            if bid == 0:
                continue
            e = expected(bid)
            assert (free_bytes, step, mb_idx, kind) == (e["free_bytes"], e["step"], e["mb_idx"], e["kind"].code), bid
            assert end_ns - open_ns == int(e["expected_duration_s"] * 1e9), bid
            assert (state, close_ns == 0) in ((BUBBLE_OPEN, True), (BUBBLE_CLOSED, False)), (bid, state, close_ns)
            snapshots += 1
            if snapshots % 50 == 0:
                for r in m.history():
                    e = expected(r.id)
                    assert (r.free_bytes, r.step, r.mb_idx, r.kind) == (
                        e["free_bytes"],
                        e["step"],
                        e["mb_idx"],
                        e["kind"],
                    )
                    assert r.predicted_ns == int(e["expected_duration_s"] * 1e9)
                    rings += 1
        assert snapshots > 1000 and rings > 1000
    finally:
        m.close()


def test_sigkill_of_the_trainer_is_detected_and_a_restarted_trainer_is_rejoined(channel_dir, peers) -> None:
    """Kill the producer at random points (often inside a write); the consumer reports the death within 3 s,
    keeps running, and re-attaches to the restarted producer (new generation, larger ids) without a restart."""
    rnd = random.Random(7)
    c = peers("consumer", channel_dir, "--verbose", "--chunk-us", "5")
    last_id, generation = 0, 0
    for round_ in range(3):
        p = peers("producer", channel_dir, "--hold-us", "40", "--gap-us", "40", "--seed", str(round_))
        assert p.expect("ready")["generation"] == round_ + 1
        ev = c.expect("bubble", where=lambda e, g=round_ + 1: e["generation"] == g)
        assert ev["id"] > last_id
        time.sleep(rnd.uniform(0.01, 0.2))
        killed_ns = p.kill()
        dead = c.expect("trainer-dead", timeout_s=5)
        assert (dead["t_ns"] - killed_ns) / 1e9 < 3.0
        last_id, generation = ev["id"], round_ + 1
    assert generation == 3
    assert c.proc.poll() is None, "the fill executor must survive its trainer's death"


def test_fill_executor_stops_cleanly_when_its_trainer_dies(channel_dir, peers) -> None:
    p = peers("producer", channel_dir, "--hold-us", "200", "--gap-us", "200")
    p.expect("ready")
    c = peers("consumer", channel_dir, "--exit-on-dead", "--verbose")
    c.expect("bubble")
    killed_ns = p.kill()
    assert (c.expect("trainer-dead", timeout_s=5)["t_ns"] - killed_ns) / 1e9 < 3.0
    c.expect("stopped", timeout_s=5)
    assert c.finish() == 0


def test_sigkill_or_stop_of_the_fill_changes_nothing_for_the_trainer(channel_dir, peers) -> None:
    """Kill (or freeze) the consumer at random points, often asleep on the futex with fill_waiting set: the
    producer goes on announcing, sees the fill gone within 3 s, and a new fill attaches and gets bubbles."""
    rnd = random.Random(11)
    p = peers("producer", channel_dir, "--hold-us", "100", "--gap-us", "300")
    p.expect("ready")
    for _ in range(2):
        c = peers("consumer", channel_dir, "--verbose", "--chunk-us", "5")
        c.expect("bubble")
        p.expect("progress", where=lambda e: e["consumer_alive"])
        time.sleep(rnd.uniform(0.0, 0.1))
        killed_ns = c.kill()
        gone = p.expect("progress", timeout_s=5, where=lambda e: not e["consumer_alive"])
        assert (gone["t_ns"] - killed_ns) / 1e9 < 3.0
        n = gone["n"]
        p.expect("progress", where=lambda e, n=n: e["n"] >= n + 500)
        c.stop()
    frozen = peers("consumer", channel_dir, "--verbose")
    frozen.expect("bubble")
    frozen.kill(signal.SIGSTOP)
    n = p.expect("progress")["n"]
    p.expect("progress", where=lambda e: e["n"] >= n + 1000)  # not blocked by a stopped consumer
    frozen.kill(signal.SIGCONT)
    frozen.expect("bubble")


def test_clean_trainer_restart_moves_an_attached_consumer_to_the_new_channel(channel_dir) -> None:
    """In one process: close + create is a restart; the consumer follows without re-attaching by hand."""
    p1 = Producer.create(channel_dir=channel_dir)
    c = Consumer.attach(channel_dir=channel_dir, timeout_s=5)
    try:
        b1 = p1.open_bubble(expected_duration_s=1.0, free_bytes=1, kind="steady", step=0, mb_idx=0)
        got = c.wait_bubble(1.0)
        assert isinstance(got, Bubble) and got.id == b1
        p1.close()  # closes the bubble and marks the channel finished
        assert not c.is_open(b1)
        assert not c.trainer_alive()
        assert c.wait_bubble(0.1) is None
        p2 = Producer.create(channel_dir=channel_dir)
        try:
            assert c.trainer_alive()
            assert c.generation == 2
            b2 = p2.open_bubble(expected_duration_s=1.0, free_bytes=1, kind="end-of-step", step=1)
            got = c.wait_bubble(1.0)
            assert got is not None and got.id == b2 > b1 and got.generation == 2 and got.mb_idx == -1
        finally:
            p2.close()
    finally:
        c.close()
