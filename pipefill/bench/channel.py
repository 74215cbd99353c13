"""``pipefill bench channel``: wake-up latency and producer cost of the bubble channel, as one JSON object.

*Wake-up latency*: from the start of ``open_bubble`` in the trainer process to ``wait_bubble`` returning in the
fill process, which sleeps on the futex (the trainer pays a FUTEX_WAKE). Measured with the two processes pinned to
different cores and to the same core, in interleaved rounds. *Producer cost*: an ``open_bubble`` + ``close_bubble``
pair with no fill asleep (shared memory only) and with the fill asleep (plus the wake syscall), and the close alone.

*Spin* (``spin``, cross core only: off when fill and trainer share a core): the trainer computes between bubbles for
a gap that repeats with a random error (``--open-error-us``, the standard deviation of a normal error: set it to
the prediction error measured on real runs, ``pipefill bench colocation``'s ``open_prediction_error_us``); the fill
predicts each open from the gaps it saw (:class:`pipefill.channel.nextopen.NextOpen`) and spins in a window of
``--spin-window-us`` around it. Rounds alternate plain futex and spin on the same pattern; reported: the wake-up
p50/p99 of each, the share of wakes the spin caught, and the CPU seconds the fill spent spinning.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

from pipefill.channel.consumer import Consumer
from pipefill.channel.futex import futex_supported
from pipefill.channel.producer import Producer

__all__ = ["main"]

_TARGETS = {"wake_us.p50": 50.0, "wake_us.p99": 200.0, "open_close_us.p50": 5.0}


def _consumer(channel_dir: str, conn: Connection) -> None:
    """The fill side: wait, note the latency, answer; until the trainer finishes the channel."""
    lat: dict[int, int] = {}
    with Consumer.attach(channel_dir=channel_dir, timeout_s=30) as c:
        conn.send("ready")
        while True:
            b = c.wait_bubble(1.0)
            if b is None:
                if not c.trainer_alive():
                    break
                continue
            lat[b.id] = time.monotonic_ns() - b.open_ns
            c.acknowledge(b.id, used_s=0.0)
    conn.send(lat)


def _stats(values_ns: list[int]) -> dict[str, float]:
    v = sorted(values_ns)
    if not v:
        return {}

    def q(p: float) -> float:
        return round(v[min(len(v) - 1, int(p * len(v)))] / 1e3, 2)

    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": q(1.0), "n": len(v)}


def _idle(duration_s: float, *, spin: bool) -> None:
    """The trainer between bubbles: computing (spin, its core stays busy) or blocked (sleep, its core idles)."""
    if not spin:
        time.sleep(duration_s)
        return
    end = time.perf_counter() + duration_s
    while time.perf_counter() < end:
        pass


def _hold(p: Producer, bubble_id: int, hold_s: float) -> None:
    """Keep the bubble open ``hold_s``, and on until the fill has seen it (at most 10 ms), so that no sample is
    lost to a bubble that closed before the fill woke: the tail stays in the percentiles."""
    time.sleep(hold_s)
    end = time.monotonic() + 0.01
    while (ans := p.fill_answer()) is None or ans.bubble_id < bubble_id:
        if time.monotonic() > end:
            return
        time.sleep(0.0001)


def _pair_costs(p: Producer, n: int) -> tuple[list[int], list[int]]:
    """Open+close and close-alone costs, ns, with no fill asleep on this channel."""
    pairs, closes = [], []
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        bid = p.open_bubble(expected_duration_s=0.001, free_bytes=1 << 30, kind="steady", step=i, mb_idx=0)
        t1 = clock()
        p.close_bubble(bid)
        t2 = clock()
        pairs.append(t2 - t0)
        closes.append(t2 - t1)
    return pairs, closes


def _consumer_spin(channel_dir: str, conn: Connection) -> None:
    """The fill side of the spin rounds: the parent names the mode before each round; per mode the latencies,
    whether the spin caught each bubble, the spin's time and the process's CPU time."""
    out: dict[str, Any] = {m: {"lat": [], "caught": 0, "spin_ns": 0, "cpu_s": 0.0} for m in ("futex", "spin")}
    mode = "futex"
    with Consumer.attach(channel_dir=channel_dir, timeout_s=30) as c:
        conn.send("ready")
        while True:
            if conn.poll():
                msg = conn.recv()
                if msg == "stop":
                    break
                mode, window_s = msg
                c.set_spin(window_s)
                conn.send("ok")
            a = c.anticipation
            caught, spin_ns, cpu = a.caught, a.spin_ns, time.process_time()
            b = c.wait_bubble(0.05)
            row = out[mode]
            row["cpu_s"] += time.process_time() - cpu
            if b is None:
                continue
            row["lat"].append(time.monotonic_ns() - b.open_ns)
            row["caught"] += a.caught - caught
            row["spin_ns"] += a.spin_ns - spin_ns
            c.acknowledge(b.id, used_s=0.0)
        errors = [abs(e) for e in c.anticipation.model.errors_ns]
    conn.send({**out, "errors_ns": errors})


def run_spin(
    *, samples: int, rounds: int, gap_s: float, error_s: float, window_s: float, hold_s: float
) -> dict[str, Any]:
    """Cross core: futex rounds and spin rounds alternating on the same bubble pattern (see the module docstring)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {"skipped": "one usable core: the fill must not spin on the trainer's core"}
    ctx = mp.get_context("spawn")
    rnd = random.Random(1)
    per_round = max(1, samples // rounds)
    with tempfile.TemporaryDirectory(
        prefix="pipefill-bench-spin-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    ) as d:
        p = Producer.create(channel_dir=d)
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_consumer_spin, args=(d, child), daemon=True)
        proc.start()
        try:
            if not parent.poll(60) or parent.recv() != "ready":
                raise RuntimeError("the benchmark's fill process did not attach within 60 s")
            os.sched_setaffinity(0, {cpus[0]})
            os.sched_setaffinity(proc.pid or 0, {cpus[1]})
            for r in range(2 * rounds):
                mode = "futex" if r % 2 == 0 else "spin"
                parent.send((mode, window_s if mode == "spin" else 0.0))
                if not parent.poll(10) or parent.recv() != "ok":
                    raise RuntimeError("the benchmark's fill process did not switch modes")
                for _ in range(per_round):
                    _idle(max(0.0, gap_s + rnd.gauss(0.0, error_s)), spin=True)  # the trainer computes
                    bid = p.open_bubble(expected_duration_s=hold_s, free_bytes=1 << 30, kind="steady", step=r, mb_idx=0)
                    time.sleep(hold_s)  # blocked on its peer
                    p.close_bubble(bid)
            parent.send("stop")
            if not parent.poll(30):
                raise RuntimeError("the benchmark's fill process did not report")
            got: dict[str, Any] = parent.recv()
        finally:
            os.sched_setaffinity(0, set(cpus))
            p.close()
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    spin, futex = got["spin"], got["futex"]
    errors = sorted(got["errors_ns"])
    return {
        "window_us": window_s * 1e6,
        "open_error_us": error_s * 1e6,
        "gap_ms": gap_s * 1e3,
        "measured_error_us": _stats(errors),
        "wake_us_futex": _stats(futex["lat"]),
        "wake_us_spin": _stats(spin["lat"]),
        "caught_share": spin["caught"] / len(spin["lat"]) if spin["lat"] else None,
        "spin_cpu_s": spin["spin_ns"] / 1e9,
        "spin_cpu_us_per_bubble": spin["spin_ns"] / 1e3 / max(1, len(spin["lat"])),
        "fill_cpu_s": {"futex": round(futex["cpu_s"], 4), "spin": round(spin["cpu_s"], 4)},
        "same_core": "off: a fill never spins on its trainer's core",
    }


def run(*, samples: int, rounds: int, gap_s: float, hold_s: float, spin: bool) -> dict[str, Any]:
    cpus = sorted(os.sched_getaffinity(0))
    configs = {"cross_core": (cpus[0], cpus[1]), "same_core": (cpus[0], cpus[0])} if len(cpus) > 1 else {}
    configs.setdefault("same_core", (cpus[0], cpus[0]))
    ctx = mp.get_context("spawn")
    rnd = random.Random(0)
    per_round = max(1, samples // rounds)
    segment_of: dict[int, str] = {}
    round_of: dict[int, int] = {}
    open_wake: dict[str, list[int]] = {k: [] for k in configs}
    spread: dict[str, list[float]] = {}
    pairs: list[int] = []
    closes: list[int] = []
    with tempfile.TemporaryDirectory(
        prefix="pipefill-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    ) as d:
        lone = Producer.create(channel_dir=os.path.join(d, "alone"))  # no fill: the shared-memory-only cost
        p = Producer.create(channel_dir=os.path.join(d, "pair"))
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_consumer, args=(os.path.join(d, "pair"), child), daemon=True)
        proc.start()
        try:
            if not parent.poll(60) or parent.recv() != "ready":
                raise RuntimeError("the benchmark's fill process did not attach within 60 s")
            time.sleep(0.2)
            for r in range(rounds):
                for name, (pcore, ccore) in configs.items():
                    os.sched_setaffinity(0, {pcore})
                    os.sched_setaffinity(proc.pid or 0, {ccore})
                    time.sleep(0.02)
                    for i in range(per_round + (1 if r == 0 else 0)):  # the first one of all warms up
                        _idle(gap_s * rnd.uniform(0.5, 1.5), spin=spin)  # the fill is asleep on the futex again
                        t0 = time.perf_counter_ns()
                        bid = p.open_bubble(
                            expected_duration_s=hold_s, free_bytes=1 << 30, kind="steady", step=r, mb_idx=i
                        )
                        t1 = time.perf_counter_ns()
                        _hold(p, bid, hold_s)
                        t2 = time.perf_counter_ns()
                        p.close_bubble(bid)
                        t3 = time.perf_counter_ns()
                        if r or i:
                            segment_of[bid] = name
                            round_of[bid] = r
                            open_wake[name].append(t1 - t0 + t3 - t2)
                    os.sched_setaffinity(0, set(cpus))
                    got = _pair_costs(lone, per_round)
                    pairs += got[0]
                    closes += got[1]
            p.close()
            if not parent.poll(30):
                raise RuntimeError("the benchmark's fill process did not report")
            lat: dict[int, int] = parent.recv()
        finally:
            os.sched_setaffinity(0, set(cpus))
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
            lone.close()
    wake = {k: [v for bid, v in lat.items() if segment_of.get(bid) == k] for k in configs}
    for k in configs:  # the spread between rounds shows how noisy the machine was
        by_round = [
            [v for bid, v in lat.items() if segment_of.get(bid) == k and round_of[bid] == r] for r in range(rounds)
        ]
        spread[k] = [_stats(v).get("p50", 0.0) for v in by_round]
    missed = {k: sum(1 for b, s in segment_of.items() if s == k and b not in lat) for k in configs}
    main_cfg = "cross_core" if "cross_core" in configs else "same_core"
    out: dict[str, Any] = {
        "wake_us": _stats(wake[main_cfg]),
        "wake_us_cross_core": _stats(wake.get("cross_core", [])),
        "wake_us_same_core": _stats(wake["same_core"]),
        "wake_us_p50_per_round": spread,
        "open_close_us": _stats(pairs),
        "close_us": _stats(closes),
        "open_close_us_fill_asleep": {k: _stats(v) for k, v in open_wake.items()},
        "samples": len(wake[main_cfg]),
        "missed": missed,
        "wake_config": main_cfg,
        "futex": futex_supported(),
        "cpus": len(cpus),
        "machine": f"{platform.machine()}, Linux {platform.release()}, Python {platform.python_version()}",
    }
    out["targets_met"] = {
        k: out[k.split(".")[0]].get(k.split(".")[1], float("inf")) <= limit for k, limit in _TARGETS.items()
    }
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="pipefill bench channel", description=__doc__)
    ap.add_argument("--json", action="store_true", help="print one JSON object (the only output format)")
    ap.add_argument("--samples", type=int, default=2000, help="bubbles per configuration (default 2000)")
    ap.add_argument("--rounds", type=int, default=8, help="interleaved rounds over the configurations (default 8)")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="mean idle time between bubbles, ms (default 1)")
    ap.add_argument(
        "--trainer",
        choices=["computes", "sleeps"],
        default="sleeps",
        help="between bubbles the trainer computes (spins: its core stays busy, as a real trainer's) "
        "or sleeps (blocked; both cores may idle); default sleeps",
    )
    ap.add_argument("--hold-ms", type=float, default=0.2, help="time each bubble stays open, ms (default 0.2)")
    ap.add_argument("--spin-window-us", type=float, default=400.0, help="spin: window around the prediction, µs")
    ap.add_argument("--open-error-us", type=float, default=100.0, help="spin: σ of the gap's error, µs (default 100)")
    ap.add_argument("--spin-gap-ms", type=float, default=2.0, help="spin: the trainer's compute between bubbles, ms")
    a = ap.parse_args(argv)
    if a.samples < 1 or a.rounds < 1:
        ap.error("--samples and --rounds must be ≥ 1")
    result = run(
        samples=a.samples, rounds=a.rounds, gap_s=a.gap_ms / 1e3, hold_s=a.hold_ms / 1e3, spin=a.trainer == "computes"
    )
    result["spin"] = run_spin(
        samples=a.samples,
        rounds=a.rounds,
        gap_s=a.spin_gap_ms / 1e3,
        error_s=a.open_error_us / 1e6,
        window_s=a.spin_window_us / 1e6,
        hold_s=a.hold_ms / 1e3,
    )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0
