"""A synthetic trainer for tests and benchmarks: the real channel producer in a loop of fixed-length bubbles and
fixed-length "compute", standing in for a pipeline stage on one core (torch-free: it needs only the channel).

During a bubble it sleeps until the bubble's absolute end (as a stage blocked on its peer's data, which arrives at a
fixed time whatever the fill does), then closes it; during compute it spins on the CPU (as a stage computing).
``--wait-fill``: the device is one the fill holds until it yields, as a GPU running the fill's last kernels does: after
closing a bubble the trainer sleeps until the fill has yielded it (its answer block; polled every
``WAIT_POLL_S``), then computes. Without it the trainer computes at once, sharing the core with a fill step still
running (equal OS priority: GPU time-slicing), so that step's remaining time doubles. Every
bubble's open/close times go to a JSONL log, CLOCK_MONOTONIC ns, to compare with the fill's event log; ``--events``
also writes them as the trainer's ``bubble`` records (buffered, flushed every 64 bubbles: off the timed path), so the
report's idle-time account applies to a synthetic run as to a real one.

usage: python -m pipefill.bench.synthetic_trainer --channel-dir D --bubbles-ms 20,50 --compute-ms 10 --count 100
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from pipefill.channel import BubbleKind, FillState, Producer
from pipefill.events import BubbleEvent, EventWriter
from pipefill.parent import stop_with_parent

__all__ = ["WAIT_POLL_S", "main"]

WAIT_POLL_S = 2e-4
"""how often a trainer that waits for the fill (``--wait-fill``) reads its answer: each read wakes the trainer on the
fill's core, so a shorter period slows the step it waits for"""
_WAIT_LIMIT_S = 10.0  # a fill that holds a closed bubble longer is stuck: the trainer goes on (the overrun says so)


def _spin_until(t_ns: int) -> None:
    while time.monotonic_ns() < t_ns:
        pass


def _sleep_until(t_ns: int) -> None:
    while (left := t_ns - time.monotonic_ns()) > 0:
        time.sleep(left / 1e9)


def _wait_for_fill(ch: Producer, bubble_id: int) -> int:
    """Sleep until the fill is no longer running ``bubble_id`` (it yielded it, took a later one, or never took it);
    the time it stopped, CLOCK_MONOTONIC ns."""
    limit_ns = time.monotonic_ns() + int(_WAIT_LIMIT_S * 1e9)
    while time.monotonic_ns() < limit_ns:
        answer = ch.fill_answer()  # None: the fill is mid-write of its answer
        if answer is not None and not (answer.bubble_id == bubble_id and answer.state == FillState.RUNNING):
            break
        if not ch.consumer_alive():
            break
        time.sleep(WAIT_POLL_S)
    return time.monotonic_ns()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipefill.bench.synthetic_trainer", description=__doc__)
    p.add_argument("--channel-dir", required=True, type=Path)
    p.add_argument("--bubbles-ms", default="20", help="bubble lengths, cycled (comma-separated ms)")
    p.add_argument("--compute-ms", type=float, default=10.0, help="spin this long between bubbles")
    p.add_argument("--count", type=int, default=100, help="bubbles to emit")
    p.add_argument("--free-bytes", type=int, default=2**30)
    p.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    p.add_argument(
        "--log", type=Path, default=None, help="JSONL of bubbles (open_ns, closing_ns, close_ns, expected_end_ns)"
    )
    p.add_argument("--wait-consumer-s", type=float, default=30.0, help="wait this long for the fill to attach")
    p.add_argument("--warmup-bubbles", type=int, default=0, help="bubbles before the logged ones (not logged)")
    p.add_argument("--measure-after", type=Path, default=None, help="and go on warming up until this file exists")
    p.add_argument("--stop-when", type=Path, default=None, help="stop after the bubble during which this file appears")
    p.add_argument(
        "--close-at",
        type=float,
        default=1.0,
        help="close each bubble after a fraction of its announced length drawn uniformly from [CLOSE_AT, 1] (a fixed "
        "seed): below 1, a trainer back early by up to 1 - CLOSE_AT of its predicted wait (default 1: on time)",
    )
    p.add_argument(
        "--wait-fill",
        action="store_true",
        help="after closing a bubble, wait for the fill to yield it before computing (an exclusive device)",
    )
    p.add_argument("--job-name", default="synthetic")
    p.add_argument("--events", type=Path, default=None, help="the trainer's event log of the logged bubbles")
    args = p.parse_args(argv)
    stop_with_parent()  # started by a benchmark: ends with it (PIPEFILL_PARENT_PID)
    lengths_s = [float(x) / 1e3 for x in args.bubbles_ms.split(",") if x.strip()]
    if not 0 < args.close_at <= 1:
        p.error(f"--close-at {args.close_at}: a fraction of the announced length, > 0 and <= 1")
    early = random.Random(0)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    log = open(args.log, "w", buffering=1) if args.log else None  # noqa: SIM115
    events = EventWriter(args.events, flush_each=False)
    with Producer.create(channel_dir=args.channel_dir, job_name=args.job_name) as ch:
        deadline = time.monotonic() + args.wait_consumer_s
        while not ch.consumer_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        print("READY", flush=True)
        compute_ns = int(args.compute_ms * 1e6)
        warmup, i = args.warmup_bubbles, 0
        while i < warmup + args.count:
            if i == warmup and args.measure_after is not None and not args.measure_after.exists():
                warmup += 1
            length_s = lengths_s[i % len(lengths_s)]
            start_ns = time.monotonic_ns()
            bid = ch.open_bubble(
                expected_duration_s=length_s, free_bytes=args.free_bytes, kind=BubbleKind.STEADY, step=i
            )
            open_ns = time.monotonic_ns()
            end_ns = open_ns + int(length_s * 1e9)
            _sleep_until(open_ns + int(length_s * early.uniform(args.close_at, 1.0) * 1e9))  # 1: on time
            closing_ns = time.monotonic_ns()  # the channel's close time lies between this and close_ns
            ch.close_bubble(bid)
            close_ns = time.monotonic_ns()
            resume_ns = _wait_for_fill(ch, bid) if args.wait_fill else close_ns
            if log is not None and i >= warmup:
                log.write(
                    json.dumps({"id": bid, "open_ns": open_ns, "expected_end_ns": end_ns, "closing_ns": closing_ns, "close_ns": close_ns,
                                "resume_ns": resume_ns, "fill_floor_ns": int(ch.fill_floor_s() * 1e9)}) + "\n"  # what the fill said then
                )  # fmt: skip
            if i >= warmup:
                events.write(BubbleEvent(step=i, idx=0, kind="steady", start_ns=start_ns, end_ns=close_ns,
                                         predicted_s=length_s, announced=True))  # fmt: skip
                if i % 64 == 0:
                    events.flush()
            _spin_until(resume_ns + compute_ns)
            i += 1
            if args.stop_when is not None and args.stop_when.exists():
                break
    if log is not None:
        log.close()
    events.close()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
