"""``pipefill bench colocation``: training alone, with bubble-coordinated fill, and with naive co-location.

For every schedule and microbatch count, each repetition runs three modes back to back (A B C A B C …, so drift in the
machine's speed hits all three alike):

* ``baseline`` (A): training alone (``spec.fill.enabled: false``);
* ``pipefill`` (B): training plus the fill executor, which works only inside the bubbles the trainer announces;
* ``naive`` (C): the same FillJob run back to back by ``python -m pipefill_fill.naive`` on the same core at the same OS
  priority, bubbles ignored — the CPU stand-in for GPU time-slicing without coordination.

A run is built as ``pipefill local`` builds one: manifests validated as admission would, processes from the pod
description (:func:`pipefill.local.procs.local_processes`). Only what the benchmark needs is remapped: one FillJob
queue per rank (each stage's fill works on its own job), the fill container's command in mode C, explicit cores (or
GPUs), and ``--replay-stage`` in replay mode. The measured steps follow a warm-up that covers ``--warmup-s`` at the pace
of training alone (one short calibration run per configuration, see :func:`_plan`), so the fill has started up
(imports, dataset, profile) before they begin; every mode measures the same step indices. Step times are the
trainers' step events; bubble fraction and recovery are ``report.json``'s, limited to the measured steps; fill items/s
is the work the fill's event log records inside the same window. Only processes are launched here: the core stays
torch-free (the GPU check asks torch in a child process).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import yaml

from pipefill import env
from pipefill.events import BubbleEvent, CommitEvent, FillEvent, JobEvent, StepEvent, WorkEvent, read_events
from pipefill.local.procs import LocalProcess, free_port, local_processes, stop_all
from pipefill.local.report import RankStats, rank_log_paths
from pipefill.local.runner import prepare
from pipefill.spec import FillJob, PipelineTrainingJob, parse, to_obj

__all__ = ["MODES", "BenchError", "main"]

MODES = ("baseline", "pipefill", "naive")
TARGETS = {"slowdown_pipefill_max": 0.02, "bubble_recovery_min": 0.7}  # issue #7; reported, never asserted
# option: (type, default, --quick default, help)
_OPTIONS: dict[str, tuple[type, Any, Any, str]] = {
    "reps": (int, 5, 1, "repetitions of A B C per configuration"),
    "steps": (int, 40, 4, "measured training steps per run"),
    "warmup-steps": (int, 5, 30, "steps before the measured ones, at least (≥ 4: the trainer profiles 3 first)"),
    "warmup-s": (float, 5.0, 0.0, "and at least this long at the pace of training alone (0: no calibration run)"),
    "schedules": (str, "1f1b,gpipe", "1f1b", "comma-separated: 1f1b, gpipe"),
    "microbatches": (str, "4,8", "4", "comma-separated microbatch counts (replay: default 8,16, --quick 8)"),
    "layers-per-stage": (int, 2, 1, "decoder blocks per pipeline stage"),
    "hidden": (int, 128, 128, "model hidden size"),
    "heads": (int, 4, 4, "attention heads"),
    "seq": (int, 64, 64, "sequence length"),
    "microbatch-size": (int, 4, 4, "samples per microbatch"),
    "fill-layers": (int, 2, 1, "layers of the encoder-inference fill workload"),
    "fill-hidden": (int, 64, 32, "hidden size of the encoder-inference fill workload"),
    "fill-samples": (int, 500_000, 100_000, "totalSamples of each rank's FillJob"),
}
_JOB = """\
apiVersion: pipefill.io/v1alpha1
kind: PipelineTrainingJob
metadata: {{name: colocation}}
spec:
  model: {{layers: {layers}, hiddenSize: {a.hidden}, heads: {a.heads}, seqLen: {a.seq}, vocabSize: 256}}
  data: {{source: synthetic}}
  # an explicit cut: a cost measurement at start-up would differ between the modes (C fills during it)
  pipeline: {{stages: {a.stages}, microbatches: {m}, globalBatch: {batch}, schedule: {schedule}, layersPerStage: {cut}}}
  steps: {steps}
  checkpoint: {{path: {ckpt}, intervalSteps: 0}}
  resources: {{gpus: 0, cpu: "1", memory: 2Gi}}
  gpuSharing: {{mode: none}}
  fill: {{enabled: {fill}, reservedMemory: 512Mi, minBubbleMilliseconds: {a.min_bubble_ms},
         guardMilliseconds: {a.guard_ms}}}
"""
_FILL = """\
apiVersion: pipefill.io/v1alpha1
kind: FillJob
metadata: {{name: colocation-fill-{rank}}}
spec:
  workload:
    kind: inference
    builtin: encoder-inference
    parameters: {{layers: {a.fill_layers}, hiddenSize: {a.fill_hidden}, heads: 4, seqLen: 32}}
  output: {{path: {out}}}
  totalSamples: {a.fill_samples}
"""


class BenchError(RuntimeError):
    """A run that cannot be measured: a trainer failed or timed out, or logged too few steps."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipefill bench colocation", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print only the JSON (progress lines go to stderr)")
    p.add_argument("--quick", action="store_true", help="smoke test: one rep of 1f1b, tiny model, few steps")
    for name, (kind, full, quick, text) in _OPTIONS.items():
        p.add_argument(f"--{name}", type=kind, help=f"{text} (default {full}; --quick {quick})")
    p.add_argument("--min-bubble-ms", type=float, default=2.0, help="spec.fill.minBubbleMilliseconds (default 2)")
    p.add_argument("--guard-ms", type=float, default=0.5, help="spec.fill.guardMilliseconds (default 0.5)")
    p.add_argument("--cores", help="cores to pin the stages to, one each (default: the first usable ones)")
    p.add_argument("--replay", action="store_true", help="replay stages of a deeper pipeline, one per core or GPU")
    p.add_argument("--pipeline-stages", type=int, default=8, help="replay: stages of the emulated pipeline")
    p.add_argument("--replay-stages", help="replay: the stages that run, comma-separated (default: first and last)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: replay mode, one stage per GPU")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up on a run after this long (default 600)")
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep every run's directory under DIR")
    return p


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise ValueError(f"{option} {text!r}: expected comma-separated non-negative integers such as 4,8")
    return values


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Defaults (full or quick), then the checks; errors name the option and the fix."""
    args.replay = args.replay or args.device == "cuda"
    if args.microbatches is None and args.replay:
        args.microbatches = "8" if args.quick else "8,16"
    for name, (_, full, quick, _) in _OPTIONS.items():
        attr = name.replace("-", "_")
        if getattr(args, attr) is None:
            setattr(args, attr, quick if args.quick else full)
    args.schedules = [s.strip() for s in args.schedules.split(",") if s.strip()]
    if not args.schedules or set(args.schedules) - {"1f1b", "gpipe"}:
        raise ValueError(f"--schedules {args.schedules}: use 1f1b, gpipe or both (one stage per rank)")
    args.microbatches = _ints(args.microbatches, "--microbatches")
    args.stages = args.pipeline_stages if args.replay else 2
    args.ranks = [0, args.stages - 1]
    if args.replay and args.replay_stages:
        args.ranks = _ints(args.replay_stages, "--replay-stages")
    if len(set(args.ranks)) != len(args.ranks) or max(args.ranks) >= args.stages:
        raise ValueError(f"--replay-stages {args.ranks}: pick distinct stages within 0..{args.stages - 1}")
    args.cores = _ints(args.cores, "--cores") if args.cores else sorted(os.sched_getaffinity(0))[: len(args.ranks)]
    if args.device == "cpu" and len(args.cores) < len(args.ranks):
        raise ValueError(
            f"{len(args.ranks)} stages need one core each, only cores {args.cores} are given or usable; "
            "pass --cores with one core per stage, or fewer --replay-stages"
        )
    if args.warmup_steps < 4 or args.steps < 1 or args.reps < 1:
        raise ValueError("--warmup-steps must be ≥ 4 (the trainer profiles 3 steps first), --steps and --reps ≥ 1")
    if "1f1b" in args.schedules and min(args.microbatches) < args.stages:
        raise ValueError(f"1f1b needs microbatches ≥ stages ({args.stages}): raise --microbatches or use gpipe")
    return args


def _gpus() -> tuple[list[str], str]:
    """Names of the visible CUDA GPUs (torch asked in a child process: the core never imports it), and why none."""
    code = "import torch\nfor i in range(torch.cuda.device_count()): print(torch.cuda.get_device_name(i))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], str(exc)
    if out.returncode != 0:
        return [], (out.stderr.strip().splitlines() or ["torch failed"])[-1]
    return [n for n in out.stdout.splitlines() if n.strip()], "torch.cuda.device_count() is 0"


def _manifests(
    a: argparse.Namespace, schedule: str, m: int, mode: str, run_dir: Path, warmup_steps: int
) -> tuple[PipelineTrainingJob, list[FillJob]]:
    text = _JOB.format(
        a=a, layers=a.layers_per_stage * a.stages, m=m, batch=m * a.microbatch_size, schedule=schedule,
        cut=[a.layers_per_stage] * a.stages, steps=warmup_steps + a.steps, ckpt=json.dumps(str(run_dir / "ckpt")),
        fill=str(mode != "baseline").lower(),
    )  # fmt: skip
    job = cast(PipelineTrainingJob, parse(yaml.safe_load(text), source="colocation job"))
    fills = [_FILL.format(a=a, rank=r, out=json.dumps(str(run_dir / "fill-out" / str(r)))) for r in a.ranks]
    return job, [] if mode == "baseline" else [cast(FillJob, parse(yaml.safe_load(f), source="fill")) for f in fills]


def _processes(a: argparse.Namespace, job: PipelineTrainingJob, fills: list[FillJob], *, mode: str, run_dir: Path,
               channel_root: Path, profile_steps: int) -> list[LocalProcess]:  # fmt: skip
    spec_file, _ = prepare(job, [], run_dir)
    procs = local_processes(
        job, spec_file=spec_file, out_dir=run_dir, work_dir=run_dir / "queue", channel_root=channel_root,
        master_port=free_port(), device=a.device, pin=False,
    )  # fmt: skip
    slot = {rank: i for i, rank in enumerate(a.ranks)}  # the core or GPU of each stage that runs
    chosen = [p for p in procs if p.rank in slot]
    for p in chosen:
        p.env[env.METRICS_PORT] = "0"  # nothing scrapes them, and a port free a moment ago may be taken by now
        if a.device == "cpu":
            p.env[env.CPU_AFFINITY] = str(a.cores[slot[p.rank]])
        else:
            p.env[env.DEVICE] = f"cuda:{slot[p.rank]}"
        if p.container == "trainer" and a.replay:
            p.argv = [*p.argv, "--replay-stage", str(p.rank), "--profile-steps", str(profile_steps)]
        elif p.container == "fill-executor":
            fill, queue = fills[slot[p.rank]], run_dir / "queue" / f"rank{p.rank}"  # one job per rank
            queue.mkdir(parents=True, exist_ok=True)
            (queue / f"{fill.name}.yaml").write_text(yaml.safe_dump(to_obj(fill), sort_keys=False), encoding="utf-8")
            p.env[env.WORK_SOURCE] = f"files:{queue}"
            if mode == "naive":
                p.argv = [sys.executable, "-m", "pipefill_fill.naive"]
    return chosen


def _tail(p: LocalProcess) -> str:
    path = p.out_dir / "output.log"
    lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines() if path.exists() else []
    return " | ".join(lines[-3:]) or "(no output)"


def _run_processes(procs: list[LocalProcess], timeout_s: float) -> list[str]:
    """Start them, wait for the trainers to finish, stop the rest; returns notes on fill processes that failed."""
    notes: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    trainers = [p for p in procs if p.container == "trainer"]
    try:
        for p in procs:
            p.start()
        while not all(p.poll() == 0 for p in trainers):
            failed = next((p for p in trainers if p.poll() not in (None, 0)), None)
            if failed is not None:
                raise BenchError(f"{failed.name} exited {failed.poll()}: {_tail(failed)}")
            if time.monotonic() > deadline:
                raise BenchError(f"a run took longer than --timeout-s {timeout_s:g}")
            for p in procs:
                if p.container == "fill-executor" and p.poll() not in (None, 0) and p.name not in notes:
                    notes[p.name] = f"{p.name} exited {p.poll()} while training ran: {_tail(p)}"
            time.sleep(0.2)
    finally:
        stop_all(procs)
    return list(notes.values())


def _items_inside(spans: list[tuple[int, int, int]], t0: int, t1: int) -> float:
    """Items done inside [t0, t1): each span's items, pro rata to the part of it inside."""
    return sum(n * max(0, min(e, t1) - max(s, t0)) / max(1, e - s) for s, e, n in spans)


def _measure_rank(run_dir: Path, rank: int, *, first: int, count: int) -> dict[str, Any]:
    trainer, fill = (read_events(path) for path in rank_log_paths(run_dir, rank))
    steps = [e for e in trainer if isinstance(e, StepEvent) and first <= e.step < first + count]
    if len(steps) < count:
        raise BenchError(f"{run_dir} rank {rank}: {len(steps)} of {count} measured steps in the trainer's event log")
    t0, t1 = min(e.start_ns for e in steps), max(e.start_ns + int(e.step_s * 1e9) for e in steps)
    measured = {e.step for e in steps}
    bubbles = [e for e in fill if isinstance(e, FillEvent)]
    rank_stats = RankStats()  # report.json's figures, fed the measured steps' events only
    for e in trainer:
        if isinstance(e, StepEvent | BubbleEvent) and e.step in measured:
            rank_stats.add(e)
    for b in bubbles:
        if t0 <= b.woke_ns < t1:
            rank_stats.add(b)
    stats = rank_stats.summary()
    spans = [(b.woke_ns, b.yielded_ns, b.items) for b in bubbles if b.items]
    spans += [(e.start_ns, e.end_ns, e.items) for e in fill if isinstance(e, WorkEvent) and e.items]
    window_s = (t1 - t0) / 1e9
    return {
        "rank": rank,
        "step_s": statistics.median(e.step_s for e in steps),
        "window_s": window_s,
        **{k: stats[k] for k in ("bubble_fraction", "announced_bubble_s", "fill_busy_s", "fill_overrun_max_s")},
        "bubble_recovery": stats["bubble_recovery"],
        "fill_items_per_s": _items_inside(spans, t0, t1) / window_s,
        "fill_committed": max((e.end for e in fill if isinstance(e, CommitEvent)), default=0),
        # > 0: the fill began working only this long after the measured steps began (raise --warmup-s)
        "fill_late_s": (min(s for s, _, _ in spans) - t0) / 1e9 if spans else None,
        "fill_job_finished": any(isinstance(e, JobEvent) and e.phase == "Succeeded" for e in fill),
    }


def _launch(
    a: argparse.Namespace, schedule: str, m: int, mode: str, run_dir: Path, *, warmup_steps: int, profile_steps: int = 3
) -> dict[str, Any]:
    """One run of one mode: its processes, then what their event logs say about the measured steps."""
    job, fills = _manifests(a, schedule, m, mode, run_dir, warmup_steps)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    channel_root = Path(tempfile.mkdtemp(prefix="pipefill-colocation-", dir=shm))
    try:
        notes = _run_processes(
            _processes(
                a, job, fills, mode=mode, run_dir=run_dir, channel_root=channel_root, profile_steps=profile_steps
            ),
            a.timeout_s,
        )
    finally:
        shutil.rmtree(channel_root, ignore_errors=True)
    ranks = [_measure_rank(run_dir, r, first=warmup_steps, count=a.steps) for r in a.ranks]
    late = max((r["fill_late_s"] for r in ranks if r["fill_late_s"] is not None), default=0.0)
    if late > 0:
        notes.append(f"a fill began working {late:.2f} s into the measured steps; raise --warmup-s")
    notes += [f"rank {r['rank']}: the fill job finished; raise --fill-samples" for r in ranks if r["fill_job_finished"]]
    if mode != "baseline":
        notes += [f"rank {r['rank']}: the fill did no work (see its log)" for r in ranks if r["fill_late_s"] is None]
    announced = sum(r["announced_bubble_s"] for r in ranks)
    fractions = [r["bubble_fraction"] for r in ranks if r["bubble_fraction"] is not None]
    return {
        "mode": mode,
        "step_s": max(r["step_s"] for r in ranks),  # the pipeline's pace is its slowest stage's (replay: separate)
        "bubble_fraction": statistics.fmean(fractions) if fractions else None,
        "bubble_recovery": sum(r["fill_busy_s"] for r in ranks) / announced if announced else None,
        "announced_bubble_s": announced,
        "fill_items_per_s": sum(r["fill_items_per_s"] for r in ranks),
        "fill_committed": sum(r["fill_committed"] for r in ranks),
        "fill_notes": notes,
        "ranks": ranks,
    }


def _median(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _summary(
    a: argparse.Namespace, schedule: str, m: int, reps: list[dict[str, Any]], plan: tuple[int, int]
) -> dict[str, Any]:
    by = {mode: [r for r in reps if r["mode"] == mode] for mode in MODES}
    base, pipefill, naive = (_median([r["step_s"] for r in by[mode]]) or 0.0 for mode in MODES)
    recovery = _median([r["bubble_recovery"] for r in by["pipefill"]])
    slowdown = pipefill / base - 1 if base else None
    return {
        "schedule": schedule,
        "stages": a.stages,
        **({"replayed_stages": a.ranks} if a.replay else {}),
        "microbatches": m,
        "baseline_step_s": base,
        "pipefill_step_s": pipefill,
        "naive_step_s": naive,
        "slowdown_pipefill": slowdown,
        "slowdown_naive": naive / base - 1 if base else None,
        "bubble_fraction": _median([r["bubble_fraction"] for r in by["baseline"]]),
        "bubble_recovery": recovery,
        "fill_items_per_s_pipefill": _median([r["fill_items_per_s"] for r in by["pipefill"]]),
        "fill_items_per_s_naive": _median([r["fill_items_per_s"] for r in by["naive"]]),
        "targets_met": {
            "slowdown_pipefill": slowdown is not None and slowdown <= TARGETS["slowdown_pipefill_max"],
            "bubble_recovery": recovery is not None and recovery >= TARGETS["bubble_recovery_min"],
        },
        # each rep's mode ÷ that rep's baseline − 1: the spread the medians hide
        **{
            f"slowdown_{mode}_per_rep": [
                r["step_s"] / b["step_s"] - 1 for b, r in zip(by["baseline"], by[mode], strict=True)
            ]
            for mode in MODES[1:]
        },
        "warmup_steps": plan[0],
        "trainer_profile_steps": plan[1],
        "measured_steps": a.steps,
        "reps": reps,
    }


def _progress(a: argparse.Namespace, run_dir: Path, text: str) -> None:
    """A line on stderr (stdout is the JSON's); the run's directory goes unless --keep."""
    print(text, file=sys.stderr, flush=True)
    if a.keep is None:
        shutil.rmtree(run_dir, ignore_errors=True)


def _run_all(a: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """Calibrate each configuration, then every repetition's A B C, interleaved; the runs' summaries."""
    configs = [(s, m) for s in a.schedules for m in a.microbatches]
    plans = {c: _plan(a, *c, root) for c in configs}  # (warm-up steps, trainer profile steps)
    reps: dict[tuple[str, int], list[dict[str, Any]]] = {c: [] for c in configs}
    for rep in range(a.reps):
        for schedule, m in configs:
            warmup_steps, profile_steps = plans[(schedule, m)]
            for mode in MODES:  # interleaved: A B C, A B C, …
                run_dir = root / f"{schedule}-m{m}" / f"rep{rep}" / mode
                r = _launch(a, schedule, m, mode, run_dir, warmup_steps=warmup_steps, profile_steps=profile_steps)
                reps[(schedule, m)].append({"rep": rep, **r})
                recovery = "-" if r["bubble_recovery"] is None else f"{r['bubble_recovery']:.3f}"
                _progress(a, run_dir, f"[{sum(map(len, reps.values()))}/{len(configs) * len(MODES) * a.reps}] "
                          f"{schedule} m={m} rep {rep} {mode}: step {r['step_s']:.4f} s, recovery {recovery}, "
                          f"fill {r['fill_items_per_s']:.0f} items/s {' '.join(r['fill_notes'])}")  # fmt: skip
    return [_summary(a, s, m, reps[(s, m)], plans[(s, m)]) for s, m in configs]


def _plan(a: argparse.Namespace, schedule: str, m: int, root: Path) -> tuple[int, int]:
    """Warm-up steps and trainer profile steps of a configuration, from a short run of training alone (not counted).

    The fill needs about ``--warmup-s`` to start up (imports, dataset, its profile inside the first bubbles), so the
    measured steps begin that long, at the pace of training alone, after ``--warmup-steps``. A replayed trainer's
    timeline stays what its profile measured, so in replay mode the profile is taken only once the fill has started
    up (before the profile a replayed step is its compute alone, no modeled waits), and the warm-up goes on as long
    again after it.
    """
    if a.warmup_s <= 0:
        return a.warmup_steps, 3
    run_dir = root / f"{schedule}-m{m}" / "calibration"
    alone = _launch(a, schedule, m, "baseline", run_dir, warmup_steps=a.warmup_steps)
    settle = math.ceil(a.warmup_s / alone["step_s"])
    plan = (a.warmup_steps + settle, 3)
    if a.replay:
        profile_steps = 3 + math.ceil(a.warmup_s / (alone["step_s"] * (1 - (alone["bubble_fraction"] or 0))))
        plan = (profile_steps + max(a.warmup_steps, settle), profile_steps)
    _progress(a, run_dir, f"{schedule} m={m}: {alone['step_s']:.4f} s per step alone; warm-up {plan[0]} steps, "
              f"trainer profile {plan[1]}")  # fmt: skip
    return plan


def _machine(a: argparse.Namespace, gpus: list[str]) -> dict[str, Any]:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        cpuinfo = []
    try:
        torch_version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    return {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "cores_used": a.cores if a.device == "cpu" else None,
        "cpu_model": next(
            (x.split(":", 1)[1].strip() for x in cpuinfo if x.startswith("model name")), platform.machine()
        ),
        "gpus": gpus or None,
        "torch": torch_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_1_5_15_start": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str]) -> int:
    try:
        a = _resolve(_parser().parse_args(argv))
    except ValueError as exc:
        print(f"pipefill bench colocation: {exc}", file=sys.stderr)
        return 2
    gpus: list[str] = []
    if a.device == "cuda":
        gpus, why = _gpus()
        if len(gpus) < len(a.ranks):
            print(
                f"pipefill bench colocation --device cuda: {len(a.ranks)} replayed stages need one CUDA GPU each, "
                f"{len(gpus)} visible ({why}); run it on a machine with a GPU, pass fewer --replay-stages, or use "
                "--device cpu",
                file=sys.stderr,
            )
            return 2
    machine = _machine(a, gpus)
    root = a.keep or Path(tempfile.mkdtemp(prefix="pipefill-colocation-"))
    try:
        runs = _run_all(a, root)
    except BenchError as exc:
        print(f"pipefill bench colocation: {exc}", file=sys.stderr)
        return 1
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    machine["load_avg_1_5_15_end"] = [round(x, 2) for x in os.getloadavg()]
    where = f"one per {'GPU' if gpus else 'core'}"
    out = {
        "benchmark": "colocation",
        "command": shlex.join(["pipefill", "bench", "colocation", *argv]),
        "emulation": f"replay: stages {a.ranks} of a {a.stages}-stage pipeline, {where}, peers modeled"
        if a.replay
        else "CPU: one core plays one GPU; each stage's trainer and its fill (executor or naive) share that core",
        "machine": machine,
        "targets": TARGETS,
        "config": {k: v for k, v in vars(a).items() if k not in ("json", "keep")},
        "runs": runs,
    }
    print(json.dumps(out, indent=None if a.json else 1, default=str))
    return 0
