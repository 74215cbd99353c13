"""Run a PipelineTrainingJob and its FillJobs on this machine: the same manifests a cluster takes, no cluster.

Each rank's trainer and fill executor run as local processes with the command and environment the operator would
give their containers; on CPU one core plays one GPU (a stage's trainer and its fill executor share it). While it
runs: a live view (plain lines when stdout is not a terminal, or with --plain) and one Prometheus endpoint with every
process's metrics, labeled by rank and container as a cluster's scrape would.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipefill.local.manifests import load_manifests
from pipefill.local.report import overrun_causes, prepare_plotting, write_report
from pipefill.local.runner import LocalRun, describe_error
from pipefill.queue import POLICIES
from pipefill.spec import PipelineTrainingJob, SpecError, to_obj

if TYPE_CHECKING:
    from pipefill.local.metrics import ChildrenCollector, MetricsEndpoint

__all__ = ["add_arguments", "header", "run"]

_METRICS_PORT = 9400
"""Default port of the aggregated metrics endpoint; when it is taken, a free one is used (and printed)."""


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a number of seconds > 0")
    return value


def _steps(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 10**9:
        raise argparse.ArgumentTypeError(f"{text}: must be a whole number of steps within 1..1000000000")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="manifest (repeatable): one PipelineTrainingJob, any FillJobs, the ConfigMap of its custom schedule and those of the FillJobs' code",
    )
    parser.add_argument(
        "--out", type=Path, default=None, metavar="DIR", help="output directory (default: runs/<job name>)"
    )
    parser.add_argument(
        "--steps",
        type=_steps,
        default=None,
        metavar="N",
        help="train N optimizer steps instead of the manifest's spec.steps (the file is not changed)",
    )
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        default="fifo",
        help="the fill queue's policy, as the operator's --policy (default fifo; docs/fill.md)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--no-pin", action="store_true", help="do not pin each rank's processes to one core")
    parser.add_argument(
        "--plain", action="store_true", help="plain status lines instead of the live view (the default off a terminal)"
    )
    parser.add_argument(
        "--status-every",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help="seconds between plain status lines (default 5)",
    )
    parser.add_argument(
        "--no-timeline",
        action="store_true",
        help="do not draw the report's timeline.png (matplotlib: about 1.5 CPU s at the end of the run)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help=f"port of the aggregated metrics endpoint on 127.0.0.1 (default {_METRICS_PORT}, or a free one if taken; 0: a free one)",
    )


def header(job: PipelineTrainingJob, *, device: str, out_dir: Path) -> str:
    """The run's first line. A job with its own command (``spec.trainer``) has the schedule its command builds, not
    ``spec.pipeline.schedule`` (whose default would be named otherwise)."""
    pipeline = job.spec.pipeline
    trainer = job.spec.trainer
    how = f"its own command ({trainer.command[0]})" if trainer is not None else f"schedule {pipeline.schedule.value}"
    return f"{job.name}: {pipeline.stages} stages × {pipeline.data_parallel} replicas, {how}, device {device}, output {out_dir}"


def run(args: argparse.Namespace) -> int:
    try:
        manifests = load_manifests(args.filename)
    except (SpecError, ValueError) as exc:
        print(describe_error(exc), file=sys.stderr)
        return 2
    job, fills = manifests.job, manifests.fills
    if args.steps is not None:
        job.spec.steps = args.steps
    for warning in manifests.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    out_dir = args.out or Path("runs") / job.name
    cores = len(os.sched_getaffinity(0))
    stages = job.spec.pipeline.stages
    print(header(job, device=args.device, out_dir=out_dir))
    if args.device == "cpu" and stages > cores:
        print(f"note: {stages} stages on {cores} cores: several stages share a core, so timings are not a GPU's")
    try:  # the live view and the endpoint need the 'local' extra (rich, prometheus-client); the other commands do not
        from pipefill.local.live import LiveState, make_view
        from pipefill.local.metrics import ChildrenCollector
    except ImportError as exc:
        print(
            f"pipefill local needs the 'local' extra: pip install 'pipefill-operator[local]' ({exc})", file=sys.stderr
        )
        return 2
    runner = LocalRun(
        job,
        fills,
        out_dir=out_dir,
        device=args.device,
        pin=not args.no_pin,
        schedule_csv=manifests.schedule_csv,
        config_maps=manifests.config_maps,
        policy=args.policy,
    )
    endpoint = _serve_metrics(ChildrenCollector(lambda: runner.procs, outcome=runner.outcome), args.metrics_port)
    if endpoint is None:
        return 2
    print(f"metrics of every process: {endpoint.url}", flush=True)
    steps = None if job.spec.trainer is not None else job.spec.steps  # a command counts its own steps
    state = LiveState(world_size=job.world_size, out_dir=out_dir, work_dir=runner.work_dir, fills=fills, steps=steps)
    view = make_view(state, plain=args.plain, interval_s=args.status_every)
    runner.on_tick = view.tick
    if not args.no_timeline:
        prepare_plotting()  # the report's timeline: matplotlib imported while the run goes on
    try:
        outcome = runner.run()
    finally:
        endpoint.close()
        view.close(runner.outcome)  # prints the runner's events not shown yet and where things are
    files = write_report(
        job,
        out_dir,
        timeline=not args.no_timeline,
        outcome={
            "code": outcome.code,
            "reason": outcome.reason,
            "job_restarts": outcome.job_restarts,
            "fill_restarts": outcome.fill_restarts,
            "status": to_obj(outcome.status),  # the PipelineTrainingJob status the operator would have written
            "events": outcome.records,  # and the Events it would have posted
        },
    )
    report = json.loads(Path(files["report.json"]).read_text(encoding="utf-8"))
    print(f"{outcome.reason}; outputs in {out_dir}")
    print(_summary(report))
    print(_conditions(report))
    already = _already_trained(out_dir, job.spec.steps) if outcome.code == 0 else None
    if already:
        print(already)
    for name, path in files.items():
        print(f"  {name}: {path}")
    return outcome.code


def _serve_metrics(collector: ChildrenCollector, port: int | None) -> MetricsEndpoint | None:
    from pipefill.local.metrics import MetricsEndpoint

    try:
        return MetricsEndpoint(collector, port=_METRICS_PORT if port is None else port)
    except OSError as exc:
        if port is not None:
            print(
                f"--metrics-port {port}: cannot listen on 127.0.0.1:{port} ({exc.strerror}); choose another port, or 0 for a free one",
                file=sys.stderr,
            )
            return None
    print(f"note: metrics port {_METRICS_PORT} is taken; using a free one", flush=True)
    return MetricsEndpoint(collector, port=0)


def _already_trained(out_dir: Path, steps: int) -> str | None:
    """Why a finished run trained no step: it resumed from checkpoints at ``spec.steps`` already (a second run of the
    same manifests); None when it trained. The report's figures are then the earlier runs' (the logs are appended)."""
    from pipefill.events import RestartEvent, StepEvent, read_events
    from pipefill.local.report import rank_log_paths

    events = read_events(rank_log_paths(out_dir, 0)[0])
    last = max((i for i, e in enumerate(events) if isinstance(e, RestartEvent)), default=None)
    if last is None or any(isinstance(e, StepEvent) for e in events[last:]):
        return None
    at = events[last]
    assert isinstance(at, RestartEvent)
    if at.step < steps:
        return None
    return (
        f"nothing to train: the checkpoints in {at.checkpoint} are at step {at.step} of spec.steps {steps} already; "
        "the figures above are the earlier runs' (remove the checkpoints to train afresh, or pass --steps N above "
        f"{at.step} to train on from there)"
    )


def _summary(report: dict[str, Any]) -> str:
    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{100 * v:.1f}%"

    def num(v: float | None, fmt: str, scale: float = 1.0) -> str:
        return "n/a" if v is None else format(scale * v, fmt)

    rows = report["fill_jobs"].items()
    fills = ", ".join(
        f"{n} {r['committed']}/{r['total']} {r['phase']}{_paused(r)}{_overruns(r)}"
        for n, r in rows
        if r.get("started", True)
    )
    queued = [f"{n} {r['committed']}/{r['total']} {r['phase']}" for n, r in rows if not r.get("started", True)]
    if queued:  # never started: queued behind the others, not lost
        fills += f"; never started ({len(queued)}, in queue order): {', '.join(queued)}"
    return (
        f"steps {report['steps']}, loss {num(report['loss_first'], '.3f')} -> {num(report['loss_last'], '.3f')}, "
        f"step {num(report['step_s_median'], '.1f', 1e3)} ms (median), bubble fraction "
        f"{pct(report['bubble_fraction'])}, bubble recovery {pct(report['bubble_recovery'])} of the idle time, "
        f"fill jobs: {fills or 'none'}"
    )


def _conditions(report: dict[str, Any]) -> str:
    """The status as ``kubectl describe`` shows it: the phase, then each condition's type, status and reason."""
    status = report["outcome"].get("status") or {}
    conditions = ", ".join(f"{c['type']}={c['status']} ({c['reason']})" for c in status.get("conditions") or ())
    return (
        f"phase {status.get('phase', '?')}, generation {status.get('generation', 0)}: {conditions or 'no conditions'}"
    )


def _paused(row: dict[str, Any]) -> str:
    """A started job back in the queue (the training ended, or its slices were released) is not lost: say so."""
    if row["phase"] not in ("Queued", "Pending") or not row["committed"]:
        return ""
    return f" (waits for a training job's bubbles; its {row['committed']} committed are kept)"


def _overruns(row: dict[str, Any]) -> str:
    o = row.get("overruns")
    if not o or not o["bubbles"]:
        return ""
    return (
        f" (overrun p50 {o['overrun_p50_ms']:.2f} / p99 {o['overrun_p99_ms']:.2f} / max {o['overrun_max_ms']:.2f} ms "
        f"over {o['bubbles']} bubbles; past the guard {overrun_causes(o)}; the trainer waited for it at most "
        f"{o['trainer_wait_max_ms']:.2f} ms)"
    )
