"""Run a PipelineTrainingJob and its FillJobs on this machine: the same manifests a cluster takes, no cluster.

Each rank's trainer and fill executor run as local processes with the command and environment the operator would
give their containers; on CPU one core plays one GPU (a stage's trainer and its fill executor share it).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pipefill.local.runner import LocalRun, describe_error, load_manifests
from pipefill.spec import SpecError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="manifest (repeatable): one PipelineTrainingJob and any FillJobs",
    )
    parser.add_argument(
        "--out", type=Path, default=None, metavar="DIR", help="output directory (default: runs/<job name>)"
    )
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--no-pin", action="store_true", help="do not pin each rank's processes to one core")


def run(args: argparse.Namespace) -> int:
    try:
        job, fills, warnings = load_manifests(args.filename)
    except (SpecError, ValueError) as exc:
        print(describe_error(exc), file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    out_dir = args.out or Path("runs") / job.name
    cores = len(os.sched_getaffinity(0))
    stages = job.spec.pipeline.stages
    print(
        f"{job.name}: {stages} stages × {job.spec.pipeline.data_parallel} replicas, schedule {job.spec.pipeline.schedule.value}, device {args.device}, output {out_dir}"
    )
    if args.device == "cpu" and stages > cores:
        print(f"note: {stages} stages on {cores} cores: several stages share a core, so timings are not a GPU's")
    outcome = LocalRun(job, fills, out_dir=out_dir, device=args.device, pin=not args.no_pin).run()
    for line in outcome.events:
        print(line)
    print(f"{outcome.reason}; outputs in {out_dir}")
    return outcome.code
