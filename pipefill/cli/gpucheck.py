"""Run the GPU checks (docs/gpu.md) on a machine with one NVIDIA GPU, in parts of at most 10 minutes each.

``pipefill gpu-check --part 1 --out DIR`` (``make gpu-check PART=1``), then 2 and 3, or ``--part all``:

1. the CUDA paths: the machine's facts (GPU, driver, CUDA, torch) and ``pytest -m gpu`` (the trainer's bf16 step and
   device waits, NVML, the fill's attach by GPU UUID, its allocator cap, offload, profiling in GPU time);
2. co-location on the GPU: ``pipefill bench colocation --device cuda``, one replayed stage of an 8-stage pipeline
   with its fill on the same GPU (training alone, coordinated fill, naive co-location), a model sized so its bubbles
   are milliseconds of real kernels; the timeline of its last steps as a PNG;
3. MPS (its daemon started for the run and stopped after; said so where it cannot start), the fill's overruns on the
   GPU (``pipefill bench fill --device cuda``) and the channel's wake-up latency.

Every step's output goes under DIR: ``partN.json`` (each step's command, exit code, seconds and its JSON), ``partN.log``
(everything the steps printed) and ``timeline-gpu.png``. A step that fails is recorded and the part goes on; the exit
code is 1 when any failed. Without a CUDA device it stops at once and says so; ``--device cpu`` is the dry run: the
same steps at CPU sizes (what ``make test`` runs, so the entry point does not rot while no GPU is here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PARTS", "Step", "add_arguments", "plan", "run"]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Step:
    """One command of a part: ``argv`` run with ``timeout_s``; ``json_out``: its stdout is one JSON object."""

    name: str
    argv: list[str]
    timeout_s: float
    json_out: bool = False
    env: dict[str, str] = field(default_factory=dict)
    after: str | None = None
    """what to do with its results: ``timeline`` (draw the kept run's last steps)"""
    always: bool = False
    """runs whatever the budget says (stopping the MPS daemon that a step before started)"""


PARTS = {1: "the CUDA paths", 2: "co-location on the GPU", 3: "MPS, the fill's overruns and the channel"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--part", default="all", help="1, 2, 3 or all (default all; each part fits in 10 minutes)")
    p.add_argument("--out", type=Path, default=Path("runs/gpu-check"), help="output folder (default runs/gpu-check)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: the dry run at CPU sizes")
    p.add_argument(
        "--budget-s", type=float, default=570.0, help="skip the steps that would start after this long (default 570)"
    )
    p.add_argument("--plan", action="store_true", help="print the steps and exit (nothing runs)")


def _py(*args: str) -> list[str]:
    return [sys.executable, *args]


def _pipefill(*args: str) -> list[str]:
    return _py("-m", "pipefill", *args)


# The replayed pipeline of parts 2 and 3: 8 stages of 4 decoder blocks (hidden 2048, 1 024 tokens, 8 samples per
# microbatch, ~0.8 TFLOP per block and microbatch forward): the GPU, not the host, is what trainer and fill share (at
# hidden 1024 and 512 tokens an H100 ran a kernel 20 % of the time: host-bound; docs/benchmarks.md, "On a GPU").
_GPU_MODEL = ["--layers-per-stage", "4", "--hidden", "2048", "--heads", "16", "--seq", "1024", "--microbatch-size", "8"]
_GPU_FILL = ["--fill-layers", "4", "--fill-hidden", "1024", "--fill-samples", "20000000"]


def plan(part: int, device: str, out: Path) -> list[Step]:
    """The steps of one part on ``device`` (cpu: the dry run's sizes), writing under ``out``."""
    gpu = device == "cuda"
    if part == 1:
        tests = ["tests/gpu", "tests/trainer/test_devsync.py"]
        return [
            Step("facts", _py("-c", _FACTS), 120, json_out=True),
            Step("pytest-gpu", _py("-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rs", *tests), 420),
        ]
    if part == 2:
        keep = out / "colocation"
        sizes = [*_GPU_MODEL, *_GPU_FILL, "--block-pairs", "8", "--block-steps", "6", "--reps", "2", "--steps", "16"]
        common = ["--schedules", "1f1b", "--microbatches", "8", "--replay", "--replay-stages", "0"]
        argv = _pipefill("bench", "colocation", "--device", device, *common, "--json", "--keep", str(keep))
        argv += [*sizes, "--warmup-s", "4"] if gpu else ["--quick", "--warmup-s", "1"]
        return [Step("colocation", argv, 480, json_out=True, after="timeline")]
    if part == 3:
        steps: list[Step] = []
        if gpu:
            mps = out / "mps"
            mps_env = {"CUDA_MPS_PIPE_DIRECTORY": str(mps / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(mps / "log")}
            sizes = [*_GPU_MODEL, *_GPU_FILL, "--block-pairs", "6", "--block-steps", "6", "--reps", "1"]
            colocation = _pipefill("bench", "colocation", "--device", "cuda", "--schedules", "1f1b", "--microbatches")
            colocation += ["8", "--replay-stages", "0", "--steps", "16", "--warmup-s", "4", "--json", *sizes]
            steps += [
                Step("mps-start", ["nvidia-cuda-mps-control", "-d"], 30, env=mps_env),
                Step("colocation-mps", colocation, 300, json_out=True, env=mps_env),
                Step("mps-stop", ["sh", "-c", "echo quit | nvidia-cuda-mps-control"], 30, env=mps_env, always=True),
            ]
        fill = (
            ["--bubbles-ms", "2,5,10,20,50", "--loads", "idle", "--bubbles", "400"] if gpu else ["--bubbles-ms", "10"]
        )
        fill += [] if gpu else ["--loads", "idle", "--bubbles", "50"]
        steps.append(Step("fill-overruns", _pipefill("bench", "fill", "--device", device, "--json", *fill), 240, True))
        channel = [] if gpu else ["--samples", "200", "--rounds", "2"]
        steps.append(Step("channel", _pipefill("bench", "channel", "--json", *channel), 180, json_out=True))
        return steps
    raise ValueError(f"--part {part}: use 1, 2, 3 or all")


# The machine's GPU, driver, CUDA and torch, as a result records them (docs/benchmarks.md tags each figure with
# them): asked in a child process, as the core imports no torch.
_FACTS = """
import json, os, shutil, subprocess, sys
import torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
       "python": sys.version.split()[0], "cpus": len(os.sched_getaffinity(0))}
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    out.update(gpu=props.name, gpu_memory_bytes=props.total_memory, sms=props.multi_processor_count,
               capability=".".join(map(str, torch.cuda.get_device_capability(0))))
if shutil.which("nvidia-smi"):
    q = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,uuid,clocks.max.sm", "--format=csv,noheader"]
    done = subprocess.run(q, capture_output=True, text=True, timeout=60)
    out["nvidia_smi"] = done.stdout.strip() or done.stderr.strip()
print(json.dumps(out))
"""


def _cuda_devices() -> tuple[int, str]:
    code = "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return 0, f"torch does not import: {done.stderr.strip().splitlines()[-1:]}"
    version, cuda, count = done.stdout.split()
    return int(count), f"torch {version}, CUDA {cuda}, torch.cuda.device_count() {count}"


def _run_step(step: Step, log: Any, deadline: float) -> dict[str, Any]:
    record: dict[str, Any] = {"name": step.name, "command": " ".join(step.argv)}
    left = deadline - time.monotonic()
    if left < min(60.0, step.timeout_s) and not step.always:
        return {**record, "skipped": f"the part's --budget-s leaves {left:.0f} s"}
    print(f"== {step.name}: {record['command']}", file=log, flush=True)
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            step.argv,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **step.env},
            stdout=subprocess.PIPE if step.json_out else log,
            stderr=log,
            text=True,
            timeout=step.timeout_s if step.always else min(step.timeout_s, left),
        )
        record["rc"] = done.returncode
        if step.json_out:
            try:
                record["result"] = json.loads(done.stdout.strip().splitlines()[-1])
            except (json.JSONDecodeError, IndexError):
                record["stdout_tail"] = done.stdout[-2000:]
                log.write(done.stdout)
    except subprocess.TimeoutExpired:
        record["rc"] = "timeout"
    except OSError as exc:  # the program is missing (nvidia-cuda-mps-control on a machine without MPS)
        record["rc"] = f"cannot start: {exc}"
    record["seconds"] = round(time.monotonic() - t0, 1)
    print(f"== {step.name}: rc {record['rc']} after {record['seconds']} s", file=log, flush=True)
    return record


def _timeline(out: Path, record: dict[str, Any]) -> None:
    """The kept coordinated run's last steps as ``timeline-gpu.png`` (``timeline-cpu.png`` in the dry run)."""
    from pipefill.local.report import plot_timeline

    runs = sorted((out / "colocation").glob("*/rep0/pipefill"))
    result = record.get("result") or {}
    ranks = result.get("config", {}).get("ranks", [0])
    device = result.get("config", {}).get("device", "cuda")
    path = out / f"timeline-{'gpu' if device == 'cuda' else 'cpu'}.png"
    if runs and plot_timeline(runs[0], ranks, path, title=f"replayed stage {ranks} ({device})"):
        record["timeline"] = str(path)


def run(args: argparse.Namespace) -> int:
    parts = list(PARTS) if args.part == "all" else [int(x) for x in args.part.split(",") if x.strip().isdigit()]
    if not parts or set(parts) - set(PARTS):
        print(f"pipefill gpu-check: --part {args.part!r}: use 1, 2, 3 or all", file=sys.stderr)
        return 2
    if args.plan:
        for part in parts:
            for step in plan(part, args.device, args.out):
                print(f"part {part} {step.name}: {' '.join(step.argv)}")
        return 0
    if args.device == "cuda":
        count, why = _cuda_devices()
        if count < 1:
            print(
                f"pipefill gpu-check: no CUDA device ({why}); run it on a machine with an NVIDIA GPU and a CUDA build "
                "of torch, or pass --device cpu for the dry run",
                file=sys.stderr,
            )
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    failed = False
    for part in parts:
        records = []
        with open(args.out / f"part{part}.log", "a", encoding="utf-8") as log:
            for step in plan(part, args.device, args.out):
                record = _run_step(step, log, deadline)
                if step.after == "timeline" and record.get("rc") == 0:
                    _timeline(args.out, record)
                records.append(record)
                failed |= record.get("rc") not in (0, None)
                print(f"part {part} {step.name}: {record.get('rc', record.get('skipped'))}", flush=True)
        summary = {"part": part, "what": PARTS[part], "device": args.device, "steps": records}
        (args.out / f"part{part}.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return 1 if failed else 0
