"""``pipefill bench cluster``: how long the local control plane takes to start, phase by phase, as one JSON object.

Each repetition starts a fresh control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok with N GPU
nodes, CRDs applied) in a temporary directory, exactly as the test fixture and ``make cluster`` do, notes when each
phase became ready, and stops it. The binaries must be built (``make cluster-bins``); building is not timed here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pipefill.bench.machine import describe_machine
from pipefill.devcluster import BinaryMissing, StartFailed, start

__all__ = ["main"]

_PHASES = ("etcd", "kube-apiserver", "controller-manager", "nodes")


def _one(nodes: int) -> dict[str, float]:
    """Seconds from the start to each phase's readiness, and to the end."""
    marks: dict[str, float] = {}
    t0 = time.monotonic()

    def note(line: str) -> None:
        for phase in _PHASES:
            if line.startswith(phase) or (phase == "nodes" and "kwok GPU nodes Ready" in line):
                marks.setdefault(phase, time.monotonic() - t0)

    with tempfile.TemporaryDirectory(prefix="pipefill-bench-cluster-") as tmp:
        cp = start(Path(tmp), nodes=nodes, log=note)
        marks["ready"] = time.monotonic() - t0
        stop_t0 = time.monotonic()
        cp.stop()
        marks["stop"] = time.monotonic() - stop_t0
    return marks


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pipefill bench cluster", description=__doc__)
    parser.add_argument("--reps", type=int, default=3, help="control planes to start one after another (default 3)")
    parser.add_argument("--nodes", type=int, default=4, help="kwok GPU nodes per control plane (default 4)")
    parser.add_argument("--json", action="store_true", help="print only the JSON object (the default output anyway)")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.nodes < 1:
        print(f"--reps {args.reps} / --nodes {args.nodes}: both must be at least 1", file=sys.stderr)
        return 2
    try:
        runs = [_one(args.nodes) for _ in range(args.reps)]
    except (BinaryMissing, StartFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    keys = [k for k in (*_PHASES, "ready", "stop") if all(k in r for r in runs)]
    result: dict[str, Any] = {
        "benchmark": "cluster",
        "nodes": args.nodes,
        "reps": args.reps,
        "seconds_to": {k: {"median": round(statistics.median(r[k] for r in runs), 2)} for k in keys},
        "runs": [{k: round(v, 2) for k, v in r.items()} for r in runs],
        "machine": describe_machine(cores_used=None, gpus=[]),
    }
    print(json.dumps(result, indent=1))
    return 0
