"""``pipefill bench scheduler``: the time of one scheduling pass over a large synthetic cluster, per policy.

One snapshot (:func:`pipefill.queue.synthetic.synthetic_snapshot`: by default 100 training jobs × 8 ranks and 1 000
FillJobs, a third running) is built once; each policy then runs ``--repeats`` passes over it in this process,
interleaved (fifo, priority, …, fifo, priority, …) so drift in the machine's speed hits all alike. The simulator's
predictions are cached after the first pass, which is reported apart (``cold_pass_ms``). Output: one JSON object
``{"policies": {"fifo": {"pass_ms": {"p50", "p99", "min"}, "cpu_ms": {"p50"}, "assignments", "waiting"}, …},
"snapshot": {…}, …}``; ``pass_ms``: wall time, ``cpu_ms``: this process's CPU time (less sensitive to other work on
a busy machine); ``assignments``: placements the pass made, ``waiting``: FillJobs it left with a reason.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from pipefill.queue.policies import POLICIES
from pipefill.queue.scheduler import schedule_pass
from pipefill.queue.synthetic import synthetic_snapshot

__all__ = ["main"]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="pipefill bench scheduler", description=__doc__)
    ap.add_argument("--json", action="store_true", help="print one JSON object (the only output format)")
    ap.add_argument("--repeats", type=int, default=21, help="passes per policy (default 21)")
    ap.add_argument("--training-jobs", type=int, default=100, help="training jobs (default 100)")
    ap.add_argument("--ranks", type=int, default=8, help="ranks per training job (default 8)")
    ap.add_argument("--fill-jobs", type=int, default=1000, help="FillJobs (default 1000)")
    ap.add_argument("--max-jobs-per-rank", type=int, default=2, help="PIPEFILL_FILL_MAX_ACTIVE_JOBS (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic cluster (default 0)")
    args = ap.parse_args(argv)
    for name in ("repeats", "training_jobs", "ranks", "fill_jobs", "max_jobs_per_rank"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')}: {getattr(args, name)} must be ≥ 1", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    snapshot = synthetic_snapshot(
        training_jobs=args.training_jobs, ranks_per_job=args.ranks, fill_jobs=args.fill_jobs, seed=args.seed
    )
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    schedule_pass(snapshot, policy=POLICIES[0], max_jobs_per_rank=args.max_jobs_per_rank)
    cold_ms = (time.perf_counter() - t0) * 1e3
    times: dict[str, list[float]] = {p: [] for p in POLICIES}
    cpu: dict[str, list[float]] = {p: [] for p in POLICIES}
    counts: dict[str, tuple[int, int]] = {}
    for _ in range(args.repeats):
        for policy in POLICIES:
            t0, c0 = time.perf_counter(), time.process_time()
            result = schedule_pass(snapshot, policy=policy, max_jobs_per_rank=args.max_jobs_per_rank)
            cpu[policy].append((time.process_time() - c0) * 1e3)
            times[policy].append((time.perf_counter() - t0) * 1e3)
            counts[policy] = (len(result.new), len(result.reasons()))
    out = {
        "policies": {
            p: {
                "pass_ms": {"p50": _pct(times[p], 50), "p99": _pct(times[p], 99), "min": round(min(times[p]), 3)},
                "cpu_ms": {"p50": _pct(cpu[p], 50)},
                "assignments": counts[p][0],
                "waiting": counts[p][1],
            }
            for p in POLICIES
        },
        "snapshot": {
            "training_jobs": len(snapshot.training_jobs),
            "ranks": sum(len(t.ranks) for t in snapshot.training_jobs),
            "fill_jobs": len(snapshot.fill_jobs),
            "running_fill_jobs": sum(1 for j in snapshot.fill_jobs if j.assignments),
            "build_s": round(build_s, 3),
        },
        "cold_pass_ms": round(cold_ms, 3),
        "repeats": args.repeats,
        "max_jobs_per_rank": args.max_jobs_per_rank,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    json.dump(out, sys.stdout)
    print()
    return 0


def _pct(values: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)], 3)
