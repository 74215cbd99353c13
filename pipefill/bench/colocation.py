"""``pipefill bench colocation``: training alone, with bubble-coordinated fill, and with naive co-location.

For every schedule and microbatch count, first a **blocked run** (:mod:`pipefill.bench.blocks`): one training run
with its fill executors in which the fill is held (A: training alone) and released (B: PipeFill) in alternating
blocks of steps; the slowdown and its bootstrap 95 % interval (``slowdown_ci``) come from neighbouring blocks, the
recovery (``bubble_recovery``) is the fill's step time per B step ÷ the trainer's idle time per A step. Then the
separate runs, as a cross-check and for naive co-location: each repetition runs three modes back to back (A B C A B C
…, so drift in the machine's speed hits all three alike):

* ``baseline`` (A): training alone (``spec.fill.enabled: false``);
* ``pipefill`` (B): training plus the fill executor, which works only inside the bubbles the trainer announces;
* ``naive`` (C): the same FillJob run back to back by ``python -m pipefill_fill.bench_worker`` on the same core at the
  same OS priority, bubbles ignored — the CPU stand-in for GPU time-slicing without coordination.

Here: the options, the plan of runs and their summary. One run (its manifests, processes and measurements) is
:mod:`pipefill.bench.colocation_run`. The measured steps follow a warm-up that covers ``--warmup-s`` at the pace of
training alone (one short calibration run per configuration, see :func:`_plan`), so the fill has started up (imports,
dataset, profile) before they begin; every mode measures the same step indices. Only processes are launched: the core
stays torch-free (the GPU check asks torch in a child process).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipefill.bench.blocks import run_blocks
from pipefill.bench.colocation_run import launch, manifests
from pipefill.bench.machine import describe_machine, visible_gpus
from pipefill.bench.runs import in_root
from pipefill.local.procs import preloaded_launcher
from pipefill.spec import SpecError

__all__ = ["MODES", "TARGETS", "main"]

MODES = ("baseline", "pipefill", "naive")
# issue #16: the blocked run's slowdown interval below +1 %, recovery ≥ 0.90; reported, never asserted
TARGETS = {"slowdown_ci_high_max": 0.01, "bubble_recovery_min": 0.90}
# option: (type, default, --quick default, help)
_OPTIONS: dict[str, tuple[type, Any, Any, str]] = {
    "block-pairs": (int, 20, 2, "blocked run: B blocks (each between two A blocks)"),
    "block-steps": (int, 10, 4, "blocked run: steps per block"),
    "settle-steps": (int, 1, 1, "blocked run: steps at the start of each block left out (the switch settles)"),
    "reps": (int, 3, 1, "separate runs: repetitions of A B C per configuration (0: none)"),
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipefill bench colocation", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print only the JSON (progress lines go to stderr)")
    p.add_argument("--quick", action="store_true", help="smoke test: one rep of 1f1b, tiny model, few steps")
    for name, (kind, full, quick, text) in _OPTIONS.items():
        p.add_argument(f"--{name}", type=kind, help=f"{text} (default {full}; --quick {quick})")
    # 1 ms and 0.1 ms: with the fill's end model and step sizing, a 2 ms floor left 15 % of rank 0's idle time
    # unannounced and a 0.5 ms guard 9 % unused in 2.5 ms average waits, at no measurable gain in slowdown
    p.add_argument("--min-bubble-ms", type=float, default=1.0, help="spec.fill.minBubbleMilliseconds (default 1)")
    p.add_argument("--guard-ms", type=float, default=0.1, help="spec.fill.guardMilliseconds (default 0.1)")
    p.add_argument(
        "--fill-cpu-priority",
        choices=["normal", "idle"],
        default="normal",
        help="the executor's CPU policy on its trainer's core: normal (default: the stand-in for a GPU, which cannot "
        "preempt a fill step, so an overrun costs the trainer) or idle (SCHED_IDLE, what pipefill local runs: the "
        "trainer preempts the fill); the naive runner is always normal",
    )
    p.add_argument(
        "--fill-offload",
        action="store_true",
        help="the executor keeps the fill's state in pinned host memory between bubbles (PIPEFILL_FILL_OFFLOAD; GPU)",
    )
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
    if args.warmup_steps < 4 or args.steps < 1 or args.reps < 0:
        raise ValueError("--warmup-steps must be ≥ 4 (the trainer profiles 3 steps first), --steps ≥ 1, --reps ≥ 0")
    if args.block_pairs < 1 or args.block_steps < args.settle_steps + 1 or args.settle_steps < 0:
        raise ValueError("--block-pairs must be ≥ 1 and --block-steps > --settle-steps ≥ 0")
    for schedule in args.schedules:  # admission's checks, the schedule's rules among them, on every configuration
        for m in args.microbatches:
            try:
                manifests(args, schedule, m, "baseline", Path(tempfile.gettempdir()), args.warmup_steps)
            except SpecError as exc:
                raise ValueError(f"--schedules {schedule} with --microbatches {m}: {exc}") from None
    return args


def _median(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _separate(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The separate runs' medians: the cross-check of the blocked run, and naive co-location."""
    by = {mode: [r for r in reps if r["mode"] == mode] for mode in MODES}
    if not reps:
        return {}
    base, pipefill, naive = (_median([r["step_s"] for r in by[mode]]) or 0.0 for mode in MODES)
    return {
        "baseline_step_s": base,
        "pipefill_step_s": pipefill,
        "naive_step_s": naive,
        "slowdown_pipefill": pipefill / base - 1 if base else None,
        "slowdown_naive": naive / base - 1 if base else None,
        "bubble_fraction": _median([r["bubble_fraction"] for r in by["baseline"]]),
        # fill step time ÷ that run's own idle time (a separate run has no A of its own)
        "bubble_recovery": _median([r["bubble_recovery"] for r in by["pipefill"]]),
        "fill_items_per_s_pipefill": _median([r["fill_items_per_s"] for r in by["pipefill"]]),
        "fill_items_per_s_naive": _median([r["fill_items_per_s"] for r in by["naive"]]),
        # NVML, on a GPU only: how much of the time a kernel ran, per mode
        **{
            f"gpu_utilization_{mode}": _median([r["gpu_utilization"] for r in by[mode]])
            for mode in MODES
            if any("gpu_utilization" in r for r in by[mode])
        },
        # each rep's mode ÷ that rep's baseline − 1: the spread the medians hide
        **{
            f"slowdown_{mode}_per_rep": [
                r["step_s"] / b["step_s"] - 1 for b, r in zip(by["baseline"], by[mode], strict=True)
            ]
            for mode in MODES[1:]
        },
        "reps": reps,
    }


def _summary(
    a: argparse.Namespace,
    schedule: str,
    m: int,
    blocked: dict[str, Any],
    reps: list[dict[str, Any]],
    plan: tuple[int, int],
) -> dict[str, Any]:
    ci, recovery = blocked["slowdown_ci"], blocked["bubble_recovery"]
    return {
        "schedule": schedule,
        "stages": a.stages,
        **({"replayed_stages": a.ranks} if a.replay else {}),
        "microbatches": m,
        "slowdown": blocked["slowdown"],
        "slowdown_ci": ci,
        "bubble_recovery": recovery,
        "announced_recovery": blocked["announced_recovery"],
        **{k: blocked[k] for k in ("gpu_utilization_alone", "gpu_utilization_fill") if k in blocked},
        "targets_met": {
            "slowdown_ci_high": ci is not None and ci[1] <= TARGETS["slowdown_ci_high_max"],
            "bubble_recovery": recovery is not None and recovery >= TARGETS["bubble_recovery_min"],
        },
        "warmup_steps": plan[0],
        "trainer_profile_steps": plan[1],
        "blocked": blocked,
        "separate": {"measured_steps": a.steps, **_separate(reps)},
    }


def _progress(a: argparse.Namespace, run_dir: Path, text: str) -> None:
    """A line on stderr (stdout is the JSON's); the run's directory goes unless --keep."""
    print(text, file=sys.stderr, flush=True)
    if a.keep is None:
        shutil.rmtree(run_dir, ignore_errors=True)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:+.2f} %"


def _run_all(a: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """Every run's processes forked from one preloaded launcher (pipefill.local.launcher): torch imported once."""
    a.launcher = preloaded_launcher(root / "launcher.log")
    try:
        return _run_configs(a, root)
    finally:
        if a.launcher is not None:
            a.launcher.close()


def _run_configs(a: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """Per configuration: calibration, the blocked run; then every repetition's A B C, interleaved."""
    configs = [(s, m) for s in a.schedules for m in a.microbatches]
    plans = {c: _plan(a, *c, root) for c in configs}  # (warm-up steps, trainer profile steps)
    blocked: dict[tuple[str, int], dict[str, Any]] = {}
    for schedule, m in configs:
        warmup_steps, profile_steps = plans[(schedule, m)]
        run_dir = root / f"{schedule}-m{m}" / "blocked"
        b = blocked[(schedule, m)] = run_blocks(
            a, schedule, m, run_dir, warmup_steps=warmup_steps, profile_steps=profile_steps
        )
        ci = b["slowdown_ci"] or [None, None]
        recovery = "-" if b["bubble_recovery"] is None else f"{b['bubble_recovery']:.3f}"
        _progress(a, run_dir, f"{schedule} m={m} blocked: slowdown {_pct(b['slowdown'])} [{_pct(ci[0])}, "
                  f"{_pct(ci[1])}] over {b['pairs']} pairs, recovery {recovery} {' '.join(b['fill_notes'])}")  # fmt: skip
    reps: dict[tuple[str, int], list[dict[str, Any]]] = {c: [] for c in configs}
    for rep in range(a.reps):
        for schedule, m in configs:
            warmup_steps, profile_steps = plans[(schedule, m)]
            for mode in MODES:  # interleaved: A B C, A B C, …
                run_dir = root / f"{schedule}-m{m}" / f"rep{rep}" / mode
                r = launch(a, schedule, m, mode, run_dir, warmup_steps=warmup_steps, profile_steps=profile_steps)
                reps[(schedule, m)].append({"rep": rep, **r})
                recovery = "-" if r["bubble_recovery"] is None else f"{r['bubble_recovery']:.3f}"
                _progress(a, run_dir, f"[{sum(map(len, reps.values()))}/{len(configs) * len(MODES) * a.reps}] "
                          f"{schedule} m={m} rep {rep} {mode}: step {r['step_s']:.4f} s, recovery {recovery}, "
                          f"fill {r['fill_items_per_s']:.0f} items/s {' '.join(r['fill_notes'])}")  # fmt: skip
    return [_summary(a, s, m, blocked[(s, m)], reps[(s, m)], plans[(s, m)]) for s, m in configs]


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
    alone = launch(a, schedule, m, "baseline", run_dir, warmup_steps=a.warmup_steps)
    settle = math.ceil(a.warmup_s / alone["step_s"])
    plan = (a.warmup_steps + settle, 3)
    if a.replay:
        profile_steps = 3 + math.ceil(a.warmup_s / (alone["step_s"] * (1 - (alone["bubble_fraction"] or 0))))
        plan = (profile_steps + max(a.warmup_steps, settle), profile_steps)
    _progress(a, run_dir, f"{schedule} m={m}: {alone['step_s']:.4f} s per step alone; warm-up {plan[0]} steps, "
              f"trainer profile {plan[1]}")  # fmt: skip
    return plan


def main(argv: list[str]) -> int:
    try:
        a = _resolve(_parser().parse_args(argv))
    except ValueError as exc:
        print(f"pipefill bench colocation: {exc}", file=sys.stderr)
        return 2
    gpus: list[str] = []
    if a.device == "cuda":
        gpus, why = visible_gpus()
        if len(gpus) < len(a.ranks):
            print(
                f"pipefill bench colocation --device cuda: {len(a.ranks)} replayed stages need one CUDA GPU each, "
                f"{len(gpus)} visible ({why}); run it on a machine with a GPU, pass fewer --replay-stages, or use "
                "--device cpu",
                file=sys.stderr,
            )
            return 2
    machine = describe_machine(cores_used=a.cores if a.device == "cpu" else None, gpus=gpus)
    runs = in_root("colocation", a.keep, lambda root: _run_all(a, root))
    if runs is None:
        return 1
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
