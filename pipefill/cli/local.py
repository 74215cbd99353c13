"""Run a PipelineTrainingJob and its FillJobs on this machine: the same manifests a cluster takes, no cluster.

Each rank's trainer and fill executor run as local processes with the command and environment the operator would
give their containers; on CPU one core plays one GPU (a stage's trainer and its fill executor share it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pipefill.local.report import write_report
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
    files = write_report(
        job,
        out_dir,
        outcome={
            "code": outcome.code,
            "reason": outcome.reason,
            "job_restarts": outcome.job_restarts,
            "fill_restarts": outcome.fill_restarts,
        },
    )
    report = json.loads(Path(files["report.json"]).read_text(encoding="utf-8"))
    print(f"{outcome.reason}; outputs in {out_dir}")
    print(_summary(report))
    for name, path in files.items():
        print(f"  {name}: {path}")
    return outcome.code


def _summary(report: dict[str, Any]) -> str:
    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{100 * v:.1f}%"

    fills = ", ".join(f"{n} {r['committed']}/{r['total']}" for n, r in report["fill_jobs"].items()) or "none"
    return (
        f"steps {report['steps']}, loss {report['loss_first']} -> {report['loss_last']}, "
        f"step {report['step_s_median']} s (median), bubble fraction {pct(report['bubble_fraction'])}, "
        f"bubble recovery {pct(report['bubble_recovery'])}, fill jobs: {fills}"
    )
