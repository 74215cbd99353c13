"""One run of ``pipefill bench colocation``: its manifests and processes, running them, and what their event logs say.

A run is built as ``pipefill local`` builds one: manifests validated as admission would, processes from the pod
description (:func:`pipefill.local.procs.local_processes`). Only what the benchmark needs is remapped: one FillJob
queue per rank (each stage's fill works on its own job), the fill container's command in mode C (the fill image's
benchmark worker, ``python -m pipefill_fill.bench_worker``), explicit cores (or GPUs), and ``--replay-stage`` in replay
mode. Step times are the trainers' ``step`` records; bubble fraction and recovery are ``report.json``'s, limited to the
measured steps; fill items/s is the work the fill's event log records inside the same window.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, cast

import yaml

from pipefill import env
from pipefill.bench.nvml import UtilizationSampler
from pipefill.bench.runs import BenchError
from pipefill.events import (
    BubbleEvent,
    CommitEvent,
    Event,
    FillEvent,
    HoldEvent,
    JobEvent,
    StartEvent,
    StepEvent,
    WorkEvent,
    read_events,
)
from pipefill.local.procs import LocalProcess, free_port, local_processes, stop_all
from pipefill.local.report import rank_log_paths
from pipefill.local.runner import prepare
from pipefill.local.stats import RankStats, merged
from pipefill.spec import FillJob, PipelineTrainingJob, parse, to_obj

__all__ = [
    "gpu_samplers",
    "gpu_utilization",
    "launch",
    "manifests",
    "measure_rank",
    "processes",
    "rank_stats",
    "run_processes",
]

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


def manifests(
    a: argparse.Namespace, schedule: str, m: int, mode: str, run_dir: Path, warmup_steps: int, steps: int | None = None
) -> tuple[PipelineTrainingJob, list[FillJob]]:
    """The training job (``warmup_steps`` + ``steps``, default ``--steps``) and one FillJob per rank (none in A)."""
    steps = a.steps if steps is None else steps
    text = _JOB.format(
        a=a, layers=a.layers_per_stage * a.stages, m=m, batch=m * a.microbatch_size, schedule=schedule,
        cut=[a.layers_per_stage] * a.stages, steps=warmup_steps + steps, ckpt=json.dumps(str(run_dir / "ckpt")),
        fill=str(mode != "baseline").lower(),
    )  # fmt: skip
    job = cast(PipelineTrainingJob, parse(yaml.safe_load(text), source="colocation job"))
    fills = [_FILL.format(a=a, rank=r, out=json.dumps(str(run_dir / "fill-out" / str(r)))) for r in a.ranks]
    return job, [] if mode == "baseline" else [cast(FillJob, parse(yaml.safe_load(f), source="fill")) for f in fills]


def processes(a: argparse.Namespace, job: PipelineTrainingJob, fills: list[FillJob], *, mode: str, run_dir: Path,
               channel_root: Path, profile_steps: int) -> list[LocalProcess]:  # fmt: skip
    spec_file, _ = prepare(job, [], run_dir)
    procs = local_processes(
        job, spec_file=spec_file, out_dir=run_dir, work_dir=run_dir / "queue", channel_root=channel_root,
        master_port=free_port(), device=a.device, pin=False, launcher=a.launcher,
    )  # fmt: skip
    slot = {rank: i for i, rank in enumerate(a.ranks)}  # the core or GPU of each stage that runs
    chosen = [p for p in procs if p.rank in slot]
    for p in chosen:
        p.env[env.METRICS_PORT] = "0"  # nothing scrapes them, and a port free a moment ago may be taken by now
        p.env[env.BASELINE_EVERY_STEPS] = "0"  # the blocks decide where the fill works: no quiet steps inside them
        if a.device == "cpu":
            p.env[env.CPU_AFFINITY] = str(a.cores[slot[p.rank]])
        else:
            p.env[env.DEVICE] = f"cuda:{slot[p.rank]}"
            p.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the GPU numbers NVML uses (the utilization sampler's)
        if p.container == "trainer" and a.replay:
            p.argv = [*p.argv, "--replay-stage", str(p.rank), "--profile-steps", str(profile_steps)]
        elif p.container == "fill-executor":
            fill, queue = fills[slot[p.rank]], run_dir / "queue" / f"rank{p.rank}"  # one job per rank
            queue.mkdir(parents=True, exist_ok=True)
            (queue / f"{fill.name}.yaml").write_text(yaml.safe_dump(to_obj(fill), sort_keys=False), encoding="utf-8")
            p.env[env.WORK_SOURCE] = f"files:{queue}"
            p.env[env.FILL_CPU_PRIORITY] = "normal" if mode == "naive" else a.fill_cpu_priority
            if a.device == "cuda" and mode != "naive":
                p.env[env.DEVICE] = "cuda"  # the executor attaches by the GPU UUID its trainer publishes, as in a pod
            if a.fill_offload:
                p.env[env.FILL_OFFLOAD] = "1"
            if mode == "naive":
                p.argv = [sys.executable, "-m", "pipefill_fill.bench_worker"]  # the naive runner
    return chosen


@contextmanager
def gpu_samplers(a: argparse.Namespace) -> Iterator[list[UtilizationSampler]]:
    """NVML utilization of each replayed stage's GPU (``cuda:i`` for the i-th), sampled while the block runs; none on
    the CPU. CUDA and NVML number the GPUs alike when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (the runs set it)."""
    with ExitStack() as stack:
        yield [stack.enter_context(UtilizationSampler(i)) for i in range(len(a.ranks))] if a.device == "cuda" else []


def gpu_utilization(samplers: list[UtilizationSampler], windows: list[tuple[int, int]]) -> dict[str, Any]:
    """``{"gpu_utilization": mean over the GPUs of each one's mean inside the windows}`` (None where NVML gave
    nothing, with the reason); empty on the CPU."""
    if not samplers:
        return {}
    means = [s.mean(windows) for s in samplers]
    out: dict[str, Any] = {
        "gpu_utilization": None if None in means else sum(m for m in means if m is not None) / len(means)
    }
    errors = [s.error for s in samplers if s.error]
    return {**out, "gpu_utilization_error": errors[0]} if errors else out


def _tail(p: LocalProcess) -> str:
    path = p.out_dir / "output.log"
    lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines() if path.exists() else []
    return " | ".join(lines[-3:]) or "(no output)"


def run_processes(
    procs: list[LocalProcess], timeout_s: float, *, tick: Callable[[], None] | None = None, poll_s: float = 0.2
) -> list[str]:
    """Start them, wait for the trainers to finish (calling ``tick`` every ``poll_s``), stop the rest; returns notes
    on fill processes that failed."""
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
            if tick is not None:
                tick()
            time.sleep(poll_s)
    finally:
        stop_all(procs)
    return list(notes.values())


def _items_inside(spans: list[tuple[int, int, int]], t0: int, t1: int) -> float:
    """Items done inside [t0, t1): each span's items, pro rata to the part of it inside."""
    return sum(n * max(0, min(e, t1) - max(s, t0)) / max(1, e - s) for s, e, n in spans)


def measure_rank(run_dir: Path, rank: int, *, first: int, count: int) -> dict[str, Any]:
    trainer, fill = (read_events(path) for path in rank_log_paths(run_dir, rank))
    steps = [e for e in trainer if isinstance(e, StepEvent) and first <= e.step < first + count]
    if len(steps) < count:
        raise BenchError(f"{run_dir} rank {rank}: {len(steps)} of {count} measured steps in the trainer's event log")
    t0, t1 = min(e.start_ns for e in steps), max(e.start_ns + int(e.step_s * 1e9) for e in steps)
    stats = rank_stats(trainer, fill, {e.step for e in steps}, t0, t1).summary()
    bubbles = [e for e in fill if isinstance(e, FillEvent)]
    spans = [(b.woke_ns, b.yielded_ns, b.items) for b in bubbles if b.items]
    spans += [(e.start_ns, e.end_ns, e.items) for e in fill if isinstance(e, WorkEvent) and e.items]
    window_s = (t1 - t0) / 1e9
    return {
        "rank": rank,
        "t0_ns": t0,
        "t1_ns": t1,
        "step_s": statistics.median(e.step_s for e in steps),
        "window_s": window_s,
        **{k: stats[k] for k in ("bubble_fraction", "bubble_s", "announced_bubble_s", "fill_step_s")},
        **{k: stats[k] for k in ("fill_busy_s", "fill_overrun_max_s", "fill_overrun_past_close_s")},
        "bubble_recovery": stats["bubble_recovery"],
        "fill_items_per_s": _items_inside(spans, t0, t1) / window_s,
        "fill_committed": max((e.end for e in fill if isinstance(e, CommitEvent)), default=0),
        # > 0: the fill began working only this long after the measured steps began (raise --warmup-s)
        "fill_late_s": (min(s for s, _, _ in spans) - t0) / 1e9 if spans else None,
        "fill_job_finished": any(isinstance(e, JobEvent) and e.phase == "Succeeded" for e in fill),
        "idle_breakdown": stats["idle_breakdown"],
    }


def rank_stats(trainer: list[Event], fill: list[Event], steps: set[int], t0_ns: int, t1_ns: int) -> RankStats:
    """report.json's figures of one rank, fed only the given steps' records and the fill's records inside
    [t0_ns, t1_ns) (its start record too: the guard)."""
    stats = RankStats()
    for e in merged(trainer, fill):
        if isinstance(e, StepEvent | BubbleEvent):
            if e.step in steps:
                stats.add(e)
        elif isinstance(e, FillEvent):
            if t0_ns <= e.open_ns < t1_ns:
                stats.add(e)
        elif isinstance(e, StartEvent | HoldEvent):
            stats.add(e)
    stats.finish()
    return stats


def launch(
    a: argparse.Namespace, schedule: str, m: int, mode: str, run_dir: Path, *, warmup_steps: int, profile_steps: int = 3
) -> dict[str, Any]:
    """One run of one mode: its processes, then what their event logs say about the measured steps."""
    job, fills = manifests(a, schedule, m, mode, run_dir, warmup_steps)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    channel_root = Path(tempfile.mkdtemp(prefix="pipefill-colocation-", dir=shm))
    try:
        with gpu_samplers(a) as samplers:
            notes = run_processes(
                processes(
                    a, job, fills, mode=mode, run_dir=run_dir, channel_root=channel_root, profile_steps=profile_steps
                ),
                a.timeout_s,
            )
    finally:
        shutil.rmtree(channel_root, ignore_errors=True)
    ranks = [measure_rank(run_dir, r, first=warmup_steps, count=a.steps) for r in a.ranks]
    window = (min(r.pop("t0_ns") for r in ranks), max(r.pop("t1_ns") for r in ranks))
    late = max((r["fill_late_s"] for r in ranks if r["fill_late_s"] is not None), default=0.0)
    if late > 0:
        notes.append(f"a fill began working {late:.2f} s into the measured steps; raise --warmup-s")
    notes += [f"rank {r['rank']}: the fill job finished; raise --fill-samples" for r in ranks if r["fill_job_finished"]]
    if mode != "baseline":
        notes += [f"rank {r['rank']}: the fill did no work (see its log)" for r in ranks if r["fill_late_s"] is None]
    announced = sum(r["announced_bubble_s"] for r in ranks)
    idle = sum(r["bubble_s"] for r in ranks)
    fractions = [r["bubble_fraction"] for r in ranks if r["bubble_fraction"] is not None]
    return {
        "mode": mode,
        "step_s": max(r["step_s"] for r in ranks),  # the pipeline's pace is its slowest stage's (replay: separate)
        "bubble_fraction": statistics.fmean(fractions) if fractions else None,
        # this run's own idle time: the blocked run divides by training alone's (its A blocks) instead
        "bubble_recovery": sum(r["fill_step_s"] for r in ranks) / idle if idle and mode != "baseline" else None,
        "announced_bubble_s": announced,
        "fill_items_per_s": sum(r["fill_items_per_s"] for r in ranks),
        "fill_committed": sum(r["fill_committed"] for r in ranks),
        "fill_notes": notes,
        **gpu_utilization(samplers, [window]),
        "ranks": ranks,
    }
