"""``pipefill bench fill``: how much of each bubble the fill executor uses, and how far it overruns.

For each bubble length, a synthetic trainer (:mod:`pipefill.bench.synthetic_trainer`: the real channel producer in
another process) emits bubbles of that
length, each followed by fixed-length compute, pinned to the same core as the fill executor running
``encoder-inference``. Recovery = the fill's busy seconds ÷ offered bubble seconds; overrun = how long after a
bubble's expected end the fill yielded. Bubbles before the workload's profile is complete are left out (profiling runs
in the first bubbles). Prints ``{"runs": [{"bubble_ms", "recovery", "overrun_p99_ms", ...}, ...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from pipefill import env
from pipefill.events import FILL_EVENTS, FillEvent, read_events

__all__ = ["main"]


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _run_one(
    work: Path, *, bubble_ms: float, compute_ms: float, seconds: float, cpu: int, params: dict[str, Any]
) -> dict[str, Any]:
    jobs = work / "jobs"
    jobs.mkdir(parents=True)
    job = {
        "apiVersion": "pipefill.io/v1alpha1",
        "kind": "FillJob",
        "metadata": {"name": "bench"},
        "spec": {
            "workload": {"kind": "inference", "builtin": "encoder-inference", "parameters": params},
            "output": {"path": str(work / "out")},
            "totalSamples": 500_000,
        },
    }
    (jobs / "bench.yaml").write_text(yaml.safe_dump(job))
    environ = dict(os.environ, OMP_NUM_THREADS="1")
    fill_env = {
        **environ,
        env.CHANNEL_DIR: str(work / "channel"),
        env.WORK_SOURCE: f"files:{jobs}",
        env.OUT_DIR: str(work / "fill"),
        env.DEVICE: "cpu",
        env.CPU_AFFINITY: str(cpu),
        env.FILL_GUARD_MS: os.environ.get(env.FILL_GUARD_MS, "1"),
        env.LOG_LEVEL: "WARNING",
    }
    count = max(40, int(seconds / ((bubble_ms + compute_ms) / 1e3)))
    fill = subprocess.Popen([sys.executable, "-m", "pipefill_fill"], env=fill_env)
    producer = [
        sys.executable, "-m", "pipefill.bench.synthetic_trainer", "--channel-dir", str(work / "channel"),
        "--bubbles-ms", str(bubble_ms), "--compute-ms", str(compute_ms), "--count", str(count), "--cpu", str(cpu),
    ]  # fmt: skip
    subprocess.run(producer, env=environ, check=True, stdout=subprocess.DEVNULL)
    fill.wait(timeout=120)
    bubbles = [e for e in read_events(work / "fill" / FILL_EVENTS) if isinstance(e, FillEvent)]
    first = next((i for i, b in enumerate(bubbles) if b.batch_size is not None), len(bubbles))
    measured = bubbles[first:]
    offered = sum((b.expected_end_ns - b.open_ns) / 1e9 for b in measured)
    busy = sum(b.used_s for b in measured)
    overruns = [b.overrun_s * 1e3 for b in measured if b.steps]
    switch = [(b.woke_ns - b.open_ns) / 1e6 for b in measured]
    batches = sorted({b.batch_size for b in measured if b.batch_size})
    return {
        "bubble_ms": bubble_ms,
        "recovery": round(busy / offered, 4) if offered else 0.0,
        "overrun_p99_ms": round(_quantile(overruns, 0.99), 3),
        "overrun_max_ms": round(max(overruns, default=0.0), 3),
        "target_overrun_ms": max(2.0, 0.05 * bubble_ms),
        "wakeup_p50_ms": round(_quantile(switch, 0.5), 3),
        "bubbles": len(measured),
        "bubbles_used": sum(1 for b in measured if b.steps),
        "samples": sum(b.items for b in measured),
        "batch_sizes": batches,
        "fill_exit_code": fill.returncode,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pipefill bench fill", description=__doc__)
    p.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    p.add_argument("--bubbles-ms", default="10,20,50,100,200", help="bubble lengths to run, ms")
    p.add_argument("--compute-ms", type=float, default=20.0, help="trainer compute between bubbles, ms")
    p.add_argument("--seconds", type=float, default=4.0, help="run length per bubble length")
    p.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)), help="the core both processes share")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=32)
    args = p.parse_args(argv)
    params = {"layers": args.layers, "hiddenSize": args.hidden, "heads": 4, "seqLen": args.seq_len}
    runs = []
    with tempfile.TemporaryDirectory(prefix="pipefill-bench-fill-") as tmp:
        for i, ms in enumerate(float(x) for x in args.bubbles_ms.split(",")):
            work = Path(tmp) / f"run{i}"
            runs.append(
                _run_one(
                    work, bubble_ms=ms, compute_ms=args.compute_ms, seconds=args.seconds, cpu=args.cpu, params=params
                )
            )
    out = {
        "benchmark": "fill",
        "emulation": "CPU: one core plays one GPU; producer and fill executor pinned to it",
        "workload": {"builtin": "encoder-inference", **params},
        "compute_ms": args.compute_ms,
        "cpu": args.cpu,
        "runs": runs,
    }
    print(json.dumps(out, indent=None if args.json else 2))
    return 0
