"""``pipefill bench fill``: how much of each bubble the fill executor uses, and how far it overruns.

For each bubble length and each machine load, a synthetic trainer (:mod:`pipefill.bench.synthetic_trainer`: the real
channel producer in another process) emits bubbles of that length, each followed by fixed-length compute, pinned to
the same core as the fill executor running ``--workload`` (each builtin, or ``user-code``: examples/user-code's
word-stats loaded from the checkout as a FillJob's ``code.path``). Loads: ``idle`` (nothing else of ours runs) and
``busy`` (a process spinning on another core the whole time: shared caches, memory bandwidth, the host's scheduling
of the second vCPU).

``--trainer``: what the synthetic trainer does at a bubble's end while the fill still works. ``waits`` (the default):
it waits for the fill to yield before computing, as a stage whose GPU still runs the fill's last kernels — every
millisecond the fill holds the device past the bubble's end is a millisecond added to the step, the overrun.
``shares``: it computes at once on the same core at the same priority (GPU time-slicing), so a step past the end
takes about twice its remaining time to yield and the training loses half of that.

Two modes. *Steady* (the default): one job that never finishes; bubbles spent on the workload's first steps and its
in-bubble profile are left out, then ``--bubbles`` are measured per configuration, so a p99 is a real percentile,
not the maximum of a few dozen. *Whole life* (``--life``): ``--jobs`` jobs of ``--total`` units each, run one after
the other (``PIPEFILL_FILL_MAX_ACTIVE_JOBS=1``; an inference job split into slices for ``--split`` ranks, which the
one executor runs in turn), and every bubble counts, from the first job's start to the last job's completion:
start-up, profile, slice ends, final commits and the switch to the next job included.

Per configuration, in the same run: **recovery** = the fill's step time inside the bubbles ÷ their length, with
the idle-time account of ``pipefill local``'s report (:class:`pipefill.local.idle.IdleAccount`, the synthetic trainer
writes the trainer's ``bubble`` records); **overrun** = how long after a bubble's expected end the fill yielded
(p50, p99 and the maximum, over the bubbles it worked in); wake-up = bubble open to the fill running; **the
trainer's wait** = how long after closing a bubble it waited for the fill's last work on the device
(``trainer_wait_p99_ms``, ``trainer_wait_max_ms``): with ``--close-at`` below 1 the trainer comes back early, after a
random share of each bubble (a wait it mispredicted), and the fill must notice and yield.
Overruns past the guard come with their causes (``overrun_causes``: step, start-up, commit, transfer, yield), and
the worst bubbles with what a cause needs (``worst_overruns``: the last step, the time it had, a commit's write
on the writer thread meanwhile, the steal on the fill's core around it). ``steal``: on a virtual machine, the host's
steal time on the fill's core (:mod:`pipefill.bench.steal`), the bubbles it fell in, and the overruns without them.
Every configuration has a deadline (``--timeout-s``): past it, its processes are stopped, its entry in ``runs`` says
so (``timed_out``, ``error``: what it waited for and what the executor did), the other configurations still run, and
the benchmark prints them all and exits 1. Its processes end with it (``PIPEFILL_PARENT_PID``, ``PR_SET_PDEATHSIG``),
also when it is killed.
Prints ``{"runs": [{"bubble_ms", "load", "recovery", "overrun_p99_ms", "overrun_max_ms", ...}, ...]}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipefill import env
from pipefill.bench.fill_jobs import REPO, WORKLOADS, life_total, stall_report, write_jobs
from pipefill.bench.machine import describe_machine, visible_gpus
from pipefill.bench.runs import in_root
from pipefill.bench.steal import StealSampler, steal_summary
from pipefill.events import (
    FILL_EVENTS,
    TRAINER_EVENTS,
    BubbleEvent,
    CommitEvent,
    EventTail,
    FillEvent,
    JobEvent,
    ProfileEvent,
    read_events,
)
from pipefill.local.launcher import Launcher, child_environment
from pipefill.local.procs import LocalProcess, preloaded_launcher
from pipefill.local.stats import RankStats, merged, overrun_summary, quantile, worst_overruns
from pipefill.parent import signal_on_parent_death

__all__ = ["main"]

_WARMUP_BUBBLES = 20  # at least; then on until the fill's profile is complete and its step model has seen some steps
_SETTLE_S = 1.0
_TARGET_OVERRUN_P99_MS = 1.0  # at 50 ms bubbles (issue #16)


class BenchTimeout(Exception):
    """A configuration ran past ``--timeout-s``."""


def _spinner(cpu: int) -> subprocess.Popen[bytes]:
    """The ``busy`` load: a process spinning on ``cpu`` until killed (or until this process dies)."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code], preexec_fn=lambda: signal_on_parent_death(signal.SIGKILL))


def _left(deadline: float, what: str) -> float:
    """Seconds left before ``deadline`` (monotonic); :class:`BenchTimeout` naming ``what`` was awaited when none."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise BenchTimeout(what)
    return left


def _start_measuring_after_profile(work: Path, trainer: subprocess.Popen[bytes], deadline: float) -> None:
    """Let the synthetic trainer start its measured bubbles once the fill's profile is complete (plus a settle)."""
    tail = EventTail(work / "fill" / FILL_EVENTS)
    while trainer.poll() is None:
        if any(isinstance(e, ProfileEvent) for e in tail.read()):
            time.sleep(_SETTLE_S)
            (work / "measure").touch()
            return
        _left(deadline, "the fill's profile (its profile record)")
        time.sleep(0.05)


def _stop_when_done(work: Path, trainer: subprocess.Popen[bytes], names: list[str], deadline: float) -> None:
    """Whole life: let the synthetic trainer stop once every job succeeded (or the fill gave one up)."""
    tail, ended = EventTail(work / "fill" / FILL_EVENTS), set[str]()
    while trainer.poll() is None and not ended >= set(names):
        ended |= {
            e.job for e in tail.read() if isinstance(e, JobEvent) and e.phase in ("Succeeded", "Failed", "Queued")
        }
        _left(deadline, f"the jobs to end (ended: {sorted(ended) or 'none'} of {names})")
        time.sleep(0.05)
    (work / "stop").touch()


_STOP_WAIT_S = 30.0  # how long a killed fill executor is waited for


def _stop(proc: subprocess.Popen[bytes] | LocalProcess | None) -> None:
    if isinstance(proc, LocalProcess):
        proc.signal(signal.SIGKILL)
        # bounded: a forked executor killed as its start was given up on was once never reported ended by its
        # launcher, and this wait (and the benchmark, its spinner spinning) went on for good
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_STOP_WAIT_S)
        proc.close()
    elif proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def _fill_core(a: argparse.Namespace) -> int:
    others = sorted(os.sched_getaffinity(0) - {a.cpu})
    return others[-1] if a.device == "cuda" and others else a.cpu


def _run_one(
    work: Path, a: argparse.Namespace, *, bubble_ms: float, load: str, params: dict[str, Any], launcher: Launcher | None
) -> dict[str, Any]:
    """One configuration; the fill executor forked from ``launcher`` where it can (torch imported once per bench)."""
    names = [f"life-{i}" for i in range(a.jobs)] if a.life else ["bench"]
    total = (a.total or life_total(a.workload)) if a.life else None
    jobs = write_jobs(work, a.workload, names=names, total=total, encoder=params, split=a.split if a.life else 1)
    environ = child_environment()  # one OpenMP thread; the start-up variables of the launcher's children
    fill_env = {
        **environ,
        env.CHANNEL_DIR: str(work / "channel"),
        env.WORK_SOURCE: f"files:{jobs}",
        env.OUT_DIR: str(work / "fill"),
        env.DEVICE: a.device,
        # on a GPU the fill's host thread gets a core of its own (its kernels share the device, not the trainer's core)
        env.CPU_AFFINITY: str(_fill_core(a)),
        env.FILL_CPU_PRIORITY: "normal",  # a GPU cannot preempt a fill step: an overrun is measured, not hidden
        env.FILL_GUARD_MS: str(a.guard_ms),
        env.LOG_LEVEL: "WARNING",
        env.FILL_STORAGE_DIR: str(REPO),  # user-code's code.path is examples/user-code
        env.FILL_PROFILE_DIR: str(work / "profiles"),  # not <fill storage>/.pipefill: that is the checkout
        **({env.FILL_MAX_ACTIVE_JOBS: "1"} if a.life else {}),  # one job after the other: switches are measured
    }
    environ[env.PARENT_PID] = fill_env[env.PARENT_PID] = str(os.getpid())  # children end with this process
    others = sorted(os.sched_getaffinity(0) - {a.cpu})
    deadline = time.monotonic() + a.timeout_s
    spinner = _spinner(others[0]) if load == "busy" and others else None
    # the VM's steal on the fill's core, sampled from another: an overrun while it took the core is the machine's
    sampler = StealSampler(_fill_core(a), sampler_cpus=set(others[-1:]) or None).start()
    # the executor forked from ``launcher`` where it can (else Popen), its output in <work>/fill/output.log: the stall
    # report quotes its warnings
    fill = LocalProcess(
        0, "fill-executor", [sys.executable, "-m", "pipefill_fill"], fill_env, work / "fill", 0, launcher
    )
    trainer_proc: subprocess.Popen[bytes] | None = None
    try:
        (work / "fill").mkdir(parents=True, exist_ok=True)
        fill.start()
        producer = [
            sys.executable, "-m", "pipefill.bench.synthetic_trainer", "--channel-dir", str(work / "channel"),
            "--bubbles-ms", str(bubble_ms), "--compute-ms", str(a.compute_ms), "--cpu", str(a.cpu),
            "--close-at", str(a.close_at), *(["--wait-fill"] if a.trainer == "waits" else []),
            "--events", str(work / "trainer" / TRAINER_EVENTS),
        ]  # fmt: skip
        if a.life:  # every bubble, until the jobs are done
            producer += ["--count", str(10**9), "--stop-when", str(work / "stop")]
        else:
            producer += ["--count", str(a.bubbles), "--warmup-bubbles", str(_WARMUP_BUBBLES)]
            producer += ["--measure-after", str(work / "measure")]
        trainer_proc = subprocess.Popen(producer, env=environ, stdout=subprocess.DEVNULL)
        if a.life:
            _stop_when_done(work, trainer_proc, names, deadline)
        else:
            _start_measuring_after_profile(work, trainer_proc, deadline)
        try:
            code = trainer_proc.wait(timeout=_left(deadline, "the synthetic trainer's bubbles"))
        except subprocess.TimeoutExpired:
            raise BenchTimeout("the synthetic trainer's bubbles") from None
        if code != 0:
            raise RuntimeError(f"the synthetic trainer exited {code}")
        try:
            fill.wait(timeout=min(120.0, _left(deadline, "the fill executor's exit")))
        except subprocess.TimeoutExpired:
            raise BenchTimeout("the fill executor's exit (its trainer ended)") from None
    finally:  # a run that failed or timed out leaves no process behind
        sampler.stop()
        for proc in (spinner, trainer_proc, fill):  # the spinner first: nothing else then keeps a core busy
            _stop(proc)
    trainer = read_events(work / "trainer" / TRAINER_EVENTS)
    fill_log = read_events(work / "fill" / FILL_EVENTS)
    # the trainer logs only the measured bubbles: once the fill's profile is complete (steady), or all (life)
    t0 = min((e.start_ns for e in trainer if isinstance(e, BubbleEvent)), default=0)
    stats = RankStats()
    for e in merged(trainer, fill_log):
        if not isinstance(e, FillEvent) or e.open_ns >= t0:
            stats.add(e)
    stats.finish()
    summary = stats.summary()
    used = [e for e in fill_log if isinstance(e, FillEvent) and e.open_ns >= t0]
    overruns = overrun_summary(used)
    wake = [(b.woke_ns - b.open_ns) / 1e6 for b in used]
    total = summary["idle_breakdown"][-1]
    return {
        "bubble_ms": bubble_ms,
        "load": load,
        "recovery": summary["bubble_recovery"],
        "overrun_p50_ms": overruns["overrun_p50_ms"],
        "overrun_p99_ms": overruns["overrun_p99_ms"],
        "overrun_max_ms": overruns["overrun_max_ms"],
        "overrun_causes": overruns["causes"],
        # how long the synthetic trainer, back from a bubble, waited for the fill (its bubbles close on time)
        "trainer_wait_p99_ms": overruns["trainer_wait_p99_ms"],
        "trainer_wait_max_ms": overruns["trainer_wait_max_ms"],
        # the worst bubbles with what their cause needs (the last step, the time it had, a commit being written)
        "worst_overruns": worst_overruns(
            used,
            (e for e in fill_log if isinstance(e, CommitEvent)),
            stolen=lambda b: sampler.stolen_ms(b.woke_ns, b.yielded_ns),
        ),
        # the bubbles during which the VM took the fill's core, and the overruns of the others
        "steal": steal_summary(sampler, used),
        # a job's bubbles: its own and those handed to it mid-bubble (a small job may run only in those)
        "per_job": {n: overrun_summary(b for b in used if n in (b.job, b.handoff)) for n in names} if a.life else None,
        "jobs_succeeded": sorted(
            e.job for e in fill_log if isinstance(e, JobEvent) and e.phase == "Succeeded" and e.job in names
        ),
        # why a job failed (a workload unfit for the bubbles, a package the machine lacks): the run says, not just 0
        "jobs_failed": {
            e.job: e.message or ""
            for e in fill_log
            if isinstance(e, JobEvent) and e.phase == "Failed" and e.job in names
        },
        "overrun_past_close_s": round(summary["fill_overrun_past_close_s"], 6),
        "wakeup_p50_ms": round(quantile(wake, 0.5), 3),
        "wakeup_p99_ms": round(quantile(wake, 0.99), 3),
        "bubbles": total["waits"],
        "bubbles_used": sum(1 for b in used if b.steps),
        "samples": sum(b.items for b in used),
        "batch_sizes": sorted({s for b in used for s in b.batch_sizes if s}),
        "idle_share": {k: round(v, 4) for k, v in total["share"].items()},
        "fill_exit_code": fill.poll(),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pipefill bench fill", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    p.add_argument("--bubbles-ms", default="10,20,50", help="bubble lengths to run, ms (default 10,20,50)")
    p.add_argument("--loads", default="idle,busy", help="idle, busy (a process spinning on another core) or both")
    p.add_argument("--bubbles", type=int, default=1000, help="steady: measured bubbles per configuration (1000)")
    p.add_argument("--workload", default="encoder-inference", choices=WORKLOADS, help="what the fill runs")
    p.add_argument("--life", action="store_true", help="whole job lives: every bubble from start to completion")
    p.add_argument("--jobs", type=int, default=2, help="life: jobs run one after the other (default 2)")
    p.add_argument("--total", type=int, default=0, help="life: units of each job (default: a few seconds of work)")
    p.add_argument("--split", type=int, default=2, help="life: an inference job's maxParallelRanks (its slices)")
    p.add_argument("--compute-ms", type=float, default=20.0, help="trainer compute between bubbles, ms")
    p.add_argument(
        "--trainer",
        default="waits",
        choices=["waits", "shares"],
        help="at a bubble's end, the trainer waits for the fill to yield (an exclusive device; default) or computes "
        "at once beside it (time-slicing)",
    )
    p.add_argument(
        "--close-at",
        type=float,
        default=1.0,
        help="the trainer closes each bubble after a fraction of its length drawn from [CLOSE_AT, 1]: back early "
        "(its waits mispredicted); default 1, on time",
    )
    p.add_argument(
        "--timeout-s", type=float, default=900.0, help="give up on a configuration after this long (default 900)"
    )
    p.add_argument("--guard-ms", type=float, default=0.5, help="PIPEFILL_FILL_GUARD_MS of the executor (default 0.5)")
    p.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="where the fill runs (cuda: its first GPU; default cpu)",
    )
    p.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)), help="the core both processes share")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep every run's directory under DIR (default: removed)")
    args = p.parse_args(argv)
    loads = [x.strip() for x in args.loads.split(",") if x.strip()]
    if not loads or set(loads) - {"idle", "busy"} or args.bubbles < 1:
        p.error(f"--loads {args.loads!r}: use idle, busy or both; --bubbles must be ≥ 1")
    if not 0 < args.close_at <= 1:
        p.error(f"--close-at {args.close_at}: a fraction of the announced length, > 0 and <= 1 (1: on time)")
    if not args.timeout_s > 0:
        p.error(f"--timeout-s {args.timeout_s}: must be > 0 seconds")
    if args.jobs < 1 or args.total < 0 or args.split < 1:
        p.error(
            f"--jobs {args.jobs}, --total {args.total}, --split {args.split}: use --jobs ≥ 1, --split ≥ 1, --total ≥ 0"
        )
    params = {"layers": args.layers, "hiddenSize": args.hidden, "heads": 4, "seqLen": args.seq_len}
    gpus: list[str] = []
    if args.device == "cuda":
        gpus, why = visible_gpus()
        if not gpus:
            print(f"pipefill bench fill --device cuda: no CUDA GPU visible ({why}); use --device cpu", file=sys.stderr)
            return 2
    machine = describe_machine(cores_used=[args.cpu], gpus=gpus[:1])

    def run_all(root: Path) -> list[dict[str, Any]]:
        launcher = preloaded_launcher(root / "launcher.log")  # every run's executor forked from it
        try:
            return run_each(root, launcher)
        finally:
            if launcher is not None:
                launcher.close()

    def run_each(root: Path, launcher: Launcher | None) -> list[dict[str, Any]]:
        runs = []
        for i, ms in enumerate(float(x) for x in args.bubbles_ms.split(",")):
            for load in loads:  # interleaved: each length idle, then busy
                work = root / f"run{i}-{load}"
                try:
                    runs.append(_run_one(work, args, bubble_ms=ms, load=load, params=params, launcher=launcher))
                except BenchTimeout as exc:  # the others still run: one length's stall voids none of them
                    error = (
                        f"the {ms:g} ms {load} run took longer than --timeout-s {args.timeout_s:g} waiting for {exc}; "
                        f"its processes were stopped. Raise --timeout-s, or see why: {stall_report(work)}"
                    )
                    print(error, file=sys.stderr, flush=True)
                    runs.append({"bubble_ms": ms, "load": load, "timed_out": True, "error": error})
                    continue
                print(f"{ms:g} ms {load}: {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
        return runs

    runs = in_root("fill", args.keep, run_all)
    if runs is None:
        return 1
    machine["load_avg_1_5_15_end"] = [round(x, 2) for x in os.getloadavg()]
    out = {
        "benchmark": "fill",
        "emulation": f"GPU: the fill on {gpus[0]}, the synthetic trainer on core {args.cpu}"
        if gpus
        else "CPU: one core plays one GPU; producer and fill executor pinned to it",
        "machine": machine,
        "workload": {"name": args.workload, **(params if args.workload == "encoder-inference" else {})},
        "mode": "life" if args.life else "steady",
        **(
            {"jobs": args.jobs, "total": args.total or life_total(args.workload), "split": args.split}
            if args.life
            else {}
        ),
        "compute_ms": args.compute_ms,
        "close_at": args.close_at,
        "trainer": args.trainer,
        "guard_ms": args.guard_ms,
        "cpu": args.cpu,
        "targets": {"overrun_p99_ms_at_50ms": _TARGET_OVERRUN_P99_MS},
        "runs": runs,
    }
    print(json.dumps(out, indent=None if args.json else 2))
    return 1 if any(r.get("timed_out") for r in runs) else 0
