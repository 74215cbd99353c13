"""Show the execution plan of a fill workload for given bubble classes and a profile.

Each ``--bubble DURATION:FREE[:COUNT]`` is a class of bubbles (length, free device memory, bubbles of it per training
step); each ``--profile BATCH:STEP:PEAK`` a measured batch size (step time, peak memory). Prefix profiles with ``JOB@``
to plan several queued jobs at once; the output then says which job goes to which class.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pipefill.cli.units import parse_duration_s, parse_size_bytes
from pipefill.plan import (
    BubbleClass,
    JobProfile,
    ProfilePoint,
    assign_jobs,
    plan_job,
)

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bubble",
        action="append",
        required=True,
        metavar="DURATION:FREE[:COUNT]",
        help="a bubble class, e.g. 250ms:6GiB or 40ms:2GiB:3 (repeatable)",
    )
    parser.add_argument(
        "--profile",
        action="append",
        required=True,
        metavar="[JOB@]BATCH:STEP:PEAK",
        help="a profiled batch size, e.g. 16:70ms:5GiB; JOB@ names the job when planning several (repeatable)",
    )
    parser.add_argument("--priority", action="append", default=[], metavar="JOB=N", help="a job's priority (default 0)")
    parser.add_argument("--samples", type=int, default=None, help="samples (or steps) the job still has to do")
    parser.add_argument("--guard", default="1ms", help="time kept free before a bubble's expected end (default 1ms)")
    parser.add_argument("--switch", default="0ms", help="measured wake-up and switch cost per bubble (default 0ms)")
    parser.add_argument("--transfer", default="0ms", help="offload mode: state in + out per bubble (default 0ms)")
    parser.add_argument("--margin", default="0", help="device memory kept unused below the free memory (default 0)")
    parser.add_argument("--min-bubble", default="0ms", help="skip bubbles shorter than this (default 0ms)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    try:
        classes = [_bubble(text) for text in args.bubble]
        jobs = _jobs(args.profile, args.priority)
        if args.samples is not None and args.samples < 1:
            raise ValueError(f"--samples: invalid value {args.samples}: must be ≥ 1")
        costs: dict[str, Any] = {
            "guard_s": parse_duration_s(args.guard, field="--guard"),
            "switch_s": parse_duration_s(args.switch, field="--switch"),
            "margin_bytes": parse_size_bytes(args.margin, field="--margin"),
            "min_bubble_s": parse_duration_s(args.min_bubble, field="--min-bubble"),
        }
        transfer_s = parse_duration_s(args.transfer, field="--transfer")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if len(jobs) == 1:
        profile = jobs[0].profile
        out = plan_job(classes, profile, total_samples=args.samples, transfer_s=transfer_s, **costs).to_dict()
    else:
        jobs = [JobProfile(j.name, j.profile, j.priority, j.kind, transfer_s) for j in jobs]
        assignments = assign_jobs(classes, jobs, **costs)
        out = {
            "classes": [
                {
                    "job": a.job,
                    **(a.plan.to_dict(total_samples=args.samples) if a.plan else {"bubble": a.bubble.label}),
                    "candidates": {n: p.to_dict() for n, p in a.candidates.items()},
                }
                for a in assignments
            ]
        }
    if args.json:
        print(json.dumps(out))
    else:
        _print_table(out)
    return 0


def _bubble(text: str) -> BubbleClass:
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"--bubble: invalid value {text!r}: expected DURATION:FREE[:COUNT], such as 250ms:6GiB")
    count = 1.0
    if len(parts) == 3:
        try:
            count = float(parts[2])
        except ValueError:
            raise ValueError(f"--bubble: invalid count {parts[2]!r} in {text!r}: expected a number > 0") from None
        if not count > 0:
            raise ValueError(f"--bubble: invalid count {parts[2]!r} in {text!r}: expected a number > 0")
    return BubbleClass(
        duration_s=parse_duration_s(parts[0], field="--bubble"),
        free_bytes=parse_size_bytes(parts[1], field="--bubble"),
        count_per_step=count,
    )


def _jobs(profiles: list[str], priorities: list[str]) -> list[JobProfile]:
    points: dict[str, list[ProfilePoint]] = {}
    for text in profiles:
        job, _, rest = text.rpartition("@")
        parts = rest.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or int(parts[0]) < 1:
            raise ValueError(f"--profile: invalid value {text!r}: expected [JOB@]BATCH:STEP:PEAK, such as 16:70ms:5GiB")
        point = ProfilePoint(
            batch_size=int(parts[0]),
            step_s=parse_duration_s(parts[1], field="--profile"),
            peak_bytes=parse_size_bytes(parts[2], field="--profile"),
        )
        if point.step_s <= 0:
            raise ValueError(f"--profile: invalid step time in {text!r}: must be > 0")
        points.setdefault(job or "job", []).append(point)
    prio: dict[str, int] = {}
    for text in priorities:
        name, sep, value = text.partition("=")
        try:
            prio[name] = int(value)
        except ValueError:
            sep = ""
        if not sep or name not in points:
            raise ValueError(f"--priority: invalid value {text!r}: expected JOB=N with a JOB named in --profile")
    return [JobProfile(name, tuple(pts), prio.get(name, 0)) for name, pts in points.items()]


def _print_table(out: dict[str, Any]) -> None:
    rows = out.get("classes", [out])
    print(f"{'bubble':<18} {'job':<14} {'batch':>5} {'steps':>5} {'samples':>7} {'busy_ms':>8} {'needed':>7}  note")
    for r in rows:
        needed = r.get("bubbles_needed")
        print(
            f"{r['bubble']:<18} {r.get('job') or '-':<14} {r.get('batch_size') or '-':>5} {r.get('steps_per_bubble', 0):>5} "
            f"{r.get('samples_per_bubble', 0):>7} {r.get('busy_ms', 0):>8g} {needed if needed is not None else '-':>7}  "
            f"{r.get('skipped', '')}"
        )
    if "training_steps_needed" in out:
        print(
            f"samples per training step: {out['samples_per_training_step']:g}; steps needed: {out['training_steps_needed']}"
        )
