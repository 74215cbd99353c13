"""A trainer or fill executor for the channel tests, run as a real process: ``python channel_peer.py ROLE DIR ...``.

Events go to stdout as JSON lines. Bubble fields are derived from the bubble id (:func:`expected`), so a reader
can tell a torn descriptor from a whole one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any

from pipefill.channel import Bubble, BubbleKind, Consumer, Producer

KINDS = list(BubbleKind)


def expected(i: int) -> dict[str, Any]:
    """The fields of bubble ``i`` as every producer in these tests announces them."""
    return {
        "expected_duration_s": ((i % 50) + 1) * 1e-4,
        "free_bytes": i * 4099,
        "kind": KINDS[i % 4],
        "step": i * 3,
        "mb_idx": i % 97,
    }


def whole(b: Bubble) -> bool:
    """Whether ``b`` is exactly what the producer wrote for its id (no field from another bubble)."""
    e = expected(b.id)
    return (
        b.free_bytes == e["free_bytes"]
        and b.kind == e["kind"]
        and b.step == e["step"]
        and b.mb_idx == e["mb_idx"]
        and b.expected_end_ns - b.open_ns == int(e["expected_duration_s"] * 1e9)
    )


def emit(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def _pause(us: float) -> None:
    if us <= 0:
        return
    if us < 100:  # shorter than a sleep can be: spin
        end = time.perf_counter_ns() + int(us * 1000)
        while time.perf_counter_ns() < end:
            pass
    else:
        time.sleep(us / 1e6)


def producer(a: argparse.Namespace) -> int:
    rnd = random.Random(a.seed)
    p = Producer.create(channel_dir=a.dir, job_name="test-job", rank=1, stage_idx=1, num_stages=2, gpu_uuids=["GPU-t"])
    emit(event="ready", generation=p.generation, pid=os.getpid())
    closed_after: dict[int, int] = {}
    missed: list[int] = []
    n, alive = 0, None
    while a.count == 0 or n < a.count:
        bid = p.open_bubble(**expected(p._next_id))
        if a.lockstep:  # test harness only: wait until the fill has seen this bubble
            end = time.monotonic() + 5.0
            while (ans := p.fill_answer()) is None or ans.bubble_id != bid:
                if time.monotonic() > end:
                    missed.append(bid)
                    break
                time.sleep(0)
        _pause(rnd.uniform(0, a.hold_us))
        p.close_bubble(bid)
        closed_after[bid] = time.monotonic_ns()
        n += 1
        _pause(rnd.uniform(0, a.gap_us))
        if n % 100 == 0:
            now_alive = p.consumer_alive()
            if now_alive != alive or n % 1000 == 0:
                emit(event="progress", n=n, last_id=bid, consumer_alive=now_alive, t_ns=time.monotonic_ns())
                alive = now_alive
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"closed_after": closed_after, "missed": missed, "history": len(p.history())}, f)
    p.close()
    emit(event="done", n=n)
    return 0


def consumer(a: argparse.Namespace) -> int:
    c = Consumer.attach(channel_dir=a.dir, timeout_s=10.0)
    emit(event="ready", generation=c.generation, pid=os.getpid())
    gen = c.generation
    seen: list[int] = []
    torn: list[int] = []
    last_chunk: dict[int, int] = {}
    dead = False
    while True:
        b = c.wait_bubble(0.5)
        if b is None:
            if not c.trainer_alive():
                if not dead:
                    emit(event="trainer-dead", t_ns=time.monotonic_ns())
                dead = True
                if a.exit_on_dead:
                    break
            continue
        dead = False
        if c.generation != gen:
            gen = c.generation
            emit(event="reattached", generation=gen)
        if not whole(b):
            torn.append(b.id)
        seen.append(b.id)
        if a.verbose:
            emit(event="bubble", id=b.id, generation=b.generation)
        chunks = 0
        while True:  # the fill's loop: look, then work one chunk
            t0 = time.monotonic_ns()
            if not c.is_open(b.id):
                break
            last_chunk[b.id] = t0
            chunks += 1
            _pause(a.chunk_us)
        c.acknowledge(b.id, used_s=chunks * a.chunk_us / 1e6, work=chunks)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"seen": seen, "torn": torn, "last_chunk": last_chunk, "history": len(c.history())}, f)
    c.close()
    emit(event="stopped")
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["producer", "consumer"])
    ap.add_argument("dir")
    ap.add_argument("--count", type=int, default=0, help="bubbles to announce; 0: until killed")
    ap.add_argument("--hold-us", type=float, default=0.0)
    ap.add_argument("--gap-us", type=float, default=0.0)
    ap.add_argument("--chunk-us", type=float, default=20.0)
    ap.add_argument("--lockstep", action="store_true")
    ap.add_argument("--exit-on-dead", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    return producer(a) if a.role == "producer" else consumer(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
