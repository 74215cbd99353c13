"""``pipefill bench hook``: what the bubble hook costs an unchanged training command, and how well it predicts.

The same command — our plain pipelining example (``--workload pipelining``), torchtitan's llama3 debug model
(``--workload torchtitan``, the ``torchtitan`` extra) or any command of yours (``--command``) — runs as a world of
``--world`` local processes, one rank each, each pinned to its own core, alternately without the hook (A) and with it
(B): A B A B … A, ``--pairs`` B runs. Every rank of both modes carries the same step clock
(:mod:`pipefill.bench.hook_clock`: the time after each optimizer step, a public torch hook); a run's step time is the
median over its steps from ``--skip-steps`` on (the hook's warm-up and profile steps are left out) of the slowest
rank's. Hooked runs announce on a channel per rank, as in a pod, with no fill attached (the hook's own cost, not the
fill's) and every step announced (no quiet baseline steps).

Result (one JSON object): ``ratio`` — each B run's median step time ÷ the mean of its neighbouring A runs', averaged
over the B runs — with ``ratio_ci``, a 95 % percentile bootstrap interval over those pairs
(:mod:`pipefill.bench.paired`; the target of #26 is an upper end ≤ 1.01), the medians of each mode, and
``bubble_prediction_error_median``: |predicted − measured| ÷ measured over the hooked runs' bubbles from
``--skip-steps`` on whose prediction reached ``--min-bubble-ms`` (the events the hook logs; target ≤ 0.15 on CPU).
``hook_own_s_median`` is the hook's own time a step (each ``step`` record's ``hook_s``: its wrappers' bookkeeping,
not the calls they wrap) over the hooked runs' ranks and steps from ``--skip-steps`` on, and ``hook_own_share`` that
÷ the hooked step's median: what the hook itself adds, free of the run-to-run noise the ratio carries (on a shared
VM steps of one command vary by 10–50 % from minute to minute, which takes many pairs to average out).
Speed is measured on an idle machine only; tests run it tiny and assert nothing of it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipefill import env, importwatch
from pipefill.bench import hook_clock
from pipefill.bench.fill_jobs import REPO
from pipefill.bench.machine import describe_machine
from pipefill.bench.paired import Block, bootstrap_ci, pair_slowdowns
from pipefill.bench.runs import BenchError, failure, in_root, log_tail, run_logged
from pipefill.events import TRAINER_EVENTS, BubbleEvent, StepEvent, read_events
from pipefill.ports import free_port
from pipefill.usercommand import HOOK_ENV, hook_pythonpath, local_argv

__all__ = ["main"]

WORKLOADS = ("pipelining", "torchtitan")
_CORE = str(Path(importwatch.__file__).resolve().parents[1])
"""the directory holding the ``pipefill`` package"""


@dataclass(frozen=True)
class RunResult:
    hook: bool
    step_s: list[float]
    """per timed step, the slowest rank's"""
    errors: list[float]
    announced: int
    wall_s: float
    own_s: list[float]
    """the hook's own time of each rank's timed steps (hooked runs)"""

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_s)


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pipefill bench hook", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the JSON result on one line")
    p.add_argument(
        "--workload", choices=WORKLOADS, default="pipelining", help="which unchanged command (default %(default)s)"
    )
    p.add_argument("--command", default="", help="your own command instead (shell words; it sets its own steps)")
    p.add_argument("--schedule", default="1F1B", help="the workload's pipeline schedule (torch's name)")
    p.add_argument("--width", type=int, default=1024, help="--workload pipelining: the MLP's width (bubbles of ms)")
    p.add_argument("--steps", type=int, default=40, help="training steps of each run")
    p.add_argument("--skip-steps", type=int, default=5, help="steps not timed at each run's start (warm-up, profile)")
    p.add_argument("--pairs", type=int, default=4, help="hooked runs, each between two unhooked ones")
    p.add_argument("--world", type=int, default=2, help="ranks (local processes)")
    p.add_argument("--min-bubble-ms", type=float, default=1.0, help="the hook's minimum bubble to announce")
    p.add_argument("--timeout-s", type=float, default=600, help="per run")
    p.add_argument("--keep", type=Path, default=None, help="keep every run's output here")
    p.add_argument(
        "--recovery",
        action="store_true",
        help="also fill the hooked workload's bubbles (pipefill local, the inference FillJob of the examples) and "
        "our trainer's on a comparable model: each one's bubble recovery",
    )
    a = p.parse_args(argv)
    if a.recovery and a.command:
        p.error("--recovery runs the workloads' jobs: it takes --workload, not --command")
    for name in ("steps", "pairs", "world"):
        if getattr(a, name) < 1:
            p.error(f"--{name} {getattr(a, name)} must be at least 1")
    if not a.command and a.steps <= a.skip_steps + 1:
        p.error(f"--steps {a.steps} must exceed --skip-steps {a.skip_steps} by at least 2: nothing would be timed")
    return a


def workload_argv(a: argparse.Namespace, run_dir: Path) -> list[str]:
    """The command every rank runs (from the checkout's root)."""
    if a.command:
        return local_argv(shlex.split(a.command))
    if a.workload == "pipelining":
        script = REPO / "examples" / "pipelining" / "train.py"
        args = _pipelining_args(a)
    else:
        script = REPO / "examples" / "torchtitan" / "torchtitan_cpu.py"
        args = [
            "--job.config_file", str(REPO / "examples" / "torchtitan" / "llama3-debug-pp.toml"),
            "--parallelism.pipeline_parallel_schedule", a.schedule, "--training.steps", str(a.steps),
            "--job.dump_folder", str(run_dir / "dump"),
        ]  # fmt: skip
    if not script.is_file():
        raise BenchError(f"--workload {a.workload}: {script} is not there: run from a checkout, or pass --command")
    return [sys.executable, str(script), *args]


def _pipelining_args(a: argparse.Namespace) -> list[str]:
    return ["--schedule", a.schedule, "--microbatches", "4", "--steps", str(a.steps), "--width", str(a.width)]


def run_once(a: argparse.Namespace, run_dir: Path, *, hook: bool) -> RunResult:
    """One world of the command, with the hook or without; its timed steps and (hooked) prediction errors."""
    clock = run_dir / "clock"
    clock.mkdir(parents=True)
    shutil.copy2(hook_clock.__file__, clock / "sitecustomize.py")
    argv = workload_argv(a, run_dir)
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    port, cores = free_port(), sorted(os.sched_getaffinity(0))
    procs = []
    t0 = time.monotonic()
    for rank in range(a.world):
        path = [str(clock), _CORE, *inherited]  # the clock imports pipefill.importwatch
        child = {
            **os.environ, "RANK": str(rank), "WORLD_SIZE": str(a.world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
            hook_clock.ENV_FILE: str(run_dir / f"clock{rank}.json"),
        }  # fmt: skip
        if hook:
            boot, *packages = hook_pythonpath()  # the hook's sitecustomize first: it chains to the clock's
            path = [boot, str(clock), *packages, *path[1:]]
            child |= {
                HOOK_ENV: "1",
                env.CHANNEL_DIR: str(run_dir / f"channel{rank}"),
                env.OUT_DIR: str(run_dir / f"rank{rank}"),
                env.JOB_NAME: "bench-hook",
                env.FILL_MIN_BUBBLE_MS: str(a.min_bubble_ms),
                env.BASELINE_EVERY_STEPS: "0",  # every step announces: the cost measured is the hook's whole
            }
        else:
            child.pop(HOOK_ENV, None)
        child.pop(env.CPU_AFFINITY, None)  # pinned below, in both modes
        child["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
        core = cores[rank % len(cores)]
        with open(run_dir / f"output{rank}.log", "w") as log:
            pin = functools.partial(os.sched_setaffinity, 0, {core})  # both modes alike (the hook would pin alone)
            procs.append(
                subprocess.Popen(argv, env=child, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin)
            )
    codes: list[int | None]
    try:
        codes = [p.wait(timeout=max(1.0, t0 + a.timeout_s - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        codes = [None] * len(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    wall_s = time.monotonic() - t0
    mode = "hooked" if hook else "unhooked"
    for rank, code in enumerate(codes):
        if code != 0:
            tail = log_tail(run_dir / f"output{rank}.log")
            raise BenchError(f"{mode} run in {run_dir}: rank {rank} {failure(code, a.timeout_s)}:\n{tail}")
    step_s = _step_times(run_dir, a.world, skip=a.skip_steps)
    if not step_s:
        raise BenchError(f"{mode} run in {run_dir}: no optimizer step after the first {a.skip_steps} was timed")
    errors, announced, own_s = (
        _prediction(run_dir, a.world, skip=a.skip_steps, min_s=a.min_bubble_ms / 1e3) if hook else ([], 0, [])
    )
    if hook and not announced:
        raise BenchError(f"hooked run in {run_dir}: the hook announced no bubble (its output: output0.log)")
    return RunResult(hook, step_s, errors, announced, wall_s, own_s)


def _step_times(run_dir: Path, world: int, *, skip: int) -> list[float]:
    """Step k's time (k ≥ ``skip``, k ≥ 1): from optimizer step k − 1's end to step k's, the slowest rank's."""
    per_rank = []
    for rank in range(world):
        ends = json.loads((run_dir / f"clock{rank}.json").read_text())["optimizer_step_end_ns"]
        per_rank.append([(ends[k] - ends[k - 1]) / 1e9 for k in range(max(1, skip), len(ends))])
    n = min(len(s) for s in per_rank)
    return [max(s[k] for s in per_rank) for k in range(n)]


def _prediction(run_dir: Path, world: int, *, skip: int, min_s: float) -> tuple[list[float], int, list[float]]:
    """|predicted − measured| ÷ measured of each bubble predicted ≥ ``min_s`` from step ``skip`` on; how many were
    announced; the hook's own time of each rank's steps from ``skip`` on."""
    errors, announced, own = [], 0, []
    for rank in range(world):
        for e in read_events(run_dir / f"rank{rank}" / TRAINER_EVENTS):
            if isinstance(e, StepEvent) and e.step >= skip and e.hook_s is not None:
                own.append(e.hook_s)
            if not isinstance(e, BubbleEvent) or e.step < skip:
                continue
            announced += e.announced
            measured = (e.end_ns - e.start_ns) / 1e9
            if e.predicted_s >= min_s and measured > 0:
                errors.append(abs(e.predicted_s - measured) / measured)
    return errors, announced, own


def comparable_jobs(a: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The workload as a ``spec.trainer`` job (the example's), and our trainer on a comparable model: for torchtitan
    a Llama of its debug model's shape (dim 256, 6 layers, 16 heads, FFN 768, vocabulary 2048, sequence 128, 4
    microbatches of 2) from a Hugging Face config, for the pipelining example the CPU demo's GPT."""
    if a.workload == "pipelining":
        hooked = yaml.safe_load((REPO / "examples" / "pipelining" / "pipelining-demo.yaml").read_text())
        hooked["spec"]["trainer"]["args"] = _pipelining_args(a)
        ours = yaml.safe_load((REPO / "examples" / "cpu-demo.yaml").read_text())
    else:
        hooked = yaml.safe_load((REPO / "examples" / "torchtitan-llama3.yaml").read_text())
        hooked["spec"]["trainer"]["args"] += ["--parallelism.pipeline_parallel_schedule", a.schedule,
                                              "--training.steps", str(a.steps), "--job.dump_folder", "runs/dump"]  # fmt: skip
        ours = yaml.safe_load((REPO / "examples" / "hf-demo.yaml").read_text())
        ours["spec"]["model"] = {"huggingFace": {"path": "llama-debug", "weights": "random"}, "seqLen": 128}
        ours["spec"]["data"] = {"source": "synthetic"}
        ours["spec"]["pipeline"].update(microbatches=4, globalBatch=8)
    interleaved = a.schedule.lower().startswith("interleaved")  # any other: 1F1B
    ours["spec"]["pipeline"].update(schedule="interleaved-1f1b" if interleaved else "1f1b")
    if interleaved:
        ours["spec"]["pipeline"]["virtualStages"] = 2
    ours["spec"].update(steps=a.steps, checkpoint={"path": "runs/checkpoints", "intervalSteps": 0})
    for job in (hooked, ours):
        job["spec"]["fill"].update(minBubbleMilliseconds=a.min_bubble_ms)
    return hooked, ours


_LLAMA_DEBUG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 2048, "hidden_size": 256,
    "intermediate_size": 768, "num_hidden_layers": 6, "num_attention_heads": 16, "num_key_value_heads": 16,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
}  # fmt: skip


def _local(a: argparse.Namespace, directory: Path, *, ours: bool) -> dict[str, Any]:
    """``pipefill local`` of one of :func:`comparable_jobs` with the examples' inference FillJob: its report's
    recovery (fill step time ÷ the measured idle time), bubble fraction and step time."""
    directory.mkdir(parents=True)
    (directory / "examples").symlink_to(REPO / "examples")  # the manifests' relative paths
    (directory / "llama-debug").mkdir()
    (directory / "llama-debug" / "config.json").write_text(json.dumps(_LLAMA_DEBUG))
    job = comparable_jobs(a)[1 if ours else 0]
    (directory / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    argv = [sys.executable, "-m", "pipefill", "local", "-f", "job.yaml", "-f", "examples/fill-inference.yaml",
            "--plain", "--no-timeline", "--metrics-port", "0", "--out", "runs/out"]  # fmt: skip
    what = f"pipefill local of {'our trainer' if ours else 'the hooked command'} in {directory}"
    run_logged(argv, cwd=directory, log=directory / "output.log", timeout_s=a.timeout_s, what=what)
    report = json.loads((directory / "runs" / "out" / "report.json").read_text())
    keys = ("bubble_recovery", "announced_recovery", "bubble_fraction", "step_s_median", "steps")
    return {"trainer": "ours" if ours else "hooked command", **{k: report[k] for k in keys}}


def summarize(runs: list[RunResult]) -> dict[str, Any]:
    """The ratio with its interval from the A B A … A sequence of runs, the medians and the prediction error."""
    blocks = [Block("B" if r.hook else "A", (i,), (r.median_s,)) for i, r in enumerate(runs)]
    pairs = pair_slowdowns(blocks)
    ci = bootstrap_ci(pairs)
    plain = [s for r in runs if not r.hook for s in r.step_s]
    hooked = [s for r in runs if r.hook for s in r.step_s]
    errors = sorted(e for r in runs for e in r.errors)
    own = [s for r in runs for s in r.own_s]
    own_median = statistics.median(own) if own else None
    return {
        "ratio": 1 + statistics.fmean(pairs) if pairs else None,
        "ratio_ci": [1 + ci[0], 1 + ci[1]] if ci else None,
        "pair_ratios": [1 + p for p in pairs],
        "unhooked_step_s_median": statistics.median(plain),
        "hooked_step_s_median": statistics.median(hooked),
        "hook_own_s_median": own_median,
        "hook_own_share": own_median / statistics.median(hooked) if own_median is not None and hooked else None,
        "bubble_prediction_error_median": statistics.median(errors) if errors else None,
        "bubble_prediction_error_p90": errors[min(len(errors) - 1, len(errors) * 9 // 10)] if errors else None,
        "bubbles_measured": len(errors),
        "bubbles_announced": sum(r.announced for r in runs),
        "runs": [
            {"hook": r.hook, "step_s_median": r.median_s, "steps_timed": len(r.step_s), "wall_s": round(r.wall_s, 2)}
            for r in runs
        ],
        "targets": {"ratio_ci_upper_max": 1.01, "bubble_prediction_error_median_max": 0.15},
    }


def _run_all(a: argparse.Namespace, root: Path) -> tuple[list[RunResult], dict[str, Any], list[str]]:
    """The A B A B … A runs, then (``--recovery``) both jobs under ``pipefill local``; and the workload's command."""
    runs = [
        run_once(a, root / f"run{i:02d}-{'hooked' if i % 2 else 'plain'}", hook=bool(i % 2))
        for i in range(2 * a.pairs + 1)
    ]
    recovery: dict[str, Any] = {}
    if a.recovery:
        recovery = {"hooked": _local(a, root / "recovery-hooked", ours=False),
                    "ours": _local(a, root / "recovery-ours", ours=True)}  # fmt: skip
    return runs, recovery, workload_argv(a, root)


def main(argv: list[str]) -> int:
    a = _args(argv)
    machine = describe_machine(cores_used=sorted(os.sched_getaffinity(0))[: a.world], gpus=[])
    done = in_root("hook", a.keep, functools.partial(_run_all, a))
    if done is None:
        return 1
    runs, recovery, command = done
    result = {
        **summarize(runs),
        "recovery": recovery if a.recovery else None,
        "command": shlex.join(command),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k != "json"},
        "machine": machine,
    }
    print(json.dumps(result, indent=None if a.json else 1))
    return 0
